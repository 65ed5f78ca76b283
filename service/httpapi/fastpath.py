"""``POST /v1/events`` on raw ASGI, ahead of FastAPI's routing.

An event request is the one thing agents send many of, and FastAPI's generic machinery per
request (middleware stack, route matching, dependency solving, request and response objects)
costs more CPU than validating and committing the event. :class:`ServiceApp` therefore answers
exactly ``POST /v1/events`` itself with :class:`EventIntake`; every other request, and the
OpenAPI description of this one, go through FastAPI as usual. The same :class:`EventIntake`
also backs the FastAPI route, so both paths behave identically.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from recovery.errors import JournalError
from service.httpapi.auth import TokenTable
from service.httpapi.intake import GroupCommitter, field_errors, parse_events, reply_body
from service.httpapi.metrics import ServiceMetrics

EVENTS_PATH = "/v1/events"
_JSON_HEADERS = [(b"content-type", b"application/json")]
_CHALLENGE = ((b"www-authenticate", b"Bearer"),)

Reply = tuple[int, bytes, list[tuple[bytes, bytes]]]


class ClientGone(Exception):
    """The client disconnected before its body arrived: nothing to answer."""


def _bearer(scope: Scope) -> tuple[str | None, int | None]:
    """The bearer token and the declared Content-Length (None when absent or malformed)."""
    token: str | None = None
    length: int | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, rest = value.decode("latin-1").partition(" ")
            token = rest.strip() if scheme.lower() == "bearer" else None
        elif name == b"content-length":
            length = int(value) if value.isdigit() else -1
    return token, length


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None as soon as it is over ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class EventIntake:
    """Authenticate (401), bound the body (413), validate (422), authorise (403), group-commit
    (503 if that fails), reply 200 (statuses: docs/coordinator.md, "Intake API"). Nothing
    reaches the journal unless every check passed."""

    def __init__(
        self,
        tokens: TokenTable,
        committer: GroupCommitter,
        metrics: ServiceMetrics,
        max_body_bytes: int,
    ) -> None:
        self._tokens = tokens
        self._committer = committer
        self.metrics = metrics
        self._limit = max_body_bytes

    def _reject(
        self, status: int, detail: Any, extra: tuple[tuple[bytes, bytes], ...] = ()
    ) -> Reply:
        self.metrics.rejected.labels(str(status)).inc()
        return status, json.dumps({"detail": detail}).encode(), [*_JSON_HEADERS, *extra]

    async def handle(self, scope: Scope, receive: Receive) -> Reply:
        """Answer one event request. Raises ClientGone when the client left mid-body."""
        token, length = _bearer(scope)
        who = self._tokens.lookup(token)
        if who is None:
            return self._reject(401, "missing or unknown bearer token", _CHALLENGE)
        if length is not None and not 0 <= length <= self._limit:
            return self._reject(413, f"body over {self._limit} bytes")
        body = await _read_body(receive, self._limit)
        if body is None:
            return self._reject(413, f"body over {self._limit} bytes")
        try:
            events = parse_events(body)
        except ValidationError as e:
            return self._reject(422, field_errors(e))
        for event in events:
            if not who.may_report_for(event.node):
                return self._reject(
                    403, f"the token of node {who.node} may not report events for {event.node}"
                )
        try:
            new = await self._committer.commit(events)
        except JournalError as e:
            return self._reject(503, str(e))
        fresh = sum(new)
        self.metrics.accepted.inc(fresh)
        if fresh != len(new):
            self.metrics.duplicate.inc(len(new) - fresh)
        return 200, reply_body(events, new), _JSON_HEADERS


class ServiceApp(FastAPI):
    """FastAPI, except that ``POST /v1/events`` is answered by :attr:`intake` directly."""

    intake: EventIntake | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.intake is None
            or scope["type"] != "http"
            or scope["path"] != EVENTS_PATH
            or scope["method"] != "POST"
        ):
            await super().__call__(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            status, body, headers = await self.intake.handle(scope, receive)
        except ClientGone:
            return
        # With no Content-Length uvicorn would send the reply chunked: more bytes and parsing.
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.intake.metrics.observe_request("POST", EVENTS_PATH, time.perf_counter() - start)
