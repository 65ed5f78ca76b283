"""The agent's HTTP link to the coordinator: events, heartbeats and the command channel.

Every request goes *out* from the agent (it listens on no port). Answers are sorted into two
kinds, as the rest of the project does (recovery.errors):

* :class:`recovery.errors.CoordinatorUnavailableError` (a TransientError): no connection, a
  timeout, or a 5xx/429 answer. The same request may succeed later: callers retry with backoff.
* :class:`Refused`: 401, 403, 404, 409, 413 or 422. A verdict on this request: asking again
  gives the same answer, so it is never retried as it is.

The agent's token comes from a file (:func:`read_agent_token`): either the coordinator's own
tokens file (the agent picks its ``node NAME TOKEN`` line), or a file holding only the token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from recovery.errors import CoordinatorUnavailableError, RecoverError, UsageError
from recovery.httpbody import error_reason
from recovery.model import HealthEvent

#: Statuses that are a verdict on the request (never retried unchanged).
VERDICTS = frozenset({400, 401, 403, 404, 409, 413, 422})


class Refused(RecoverError):
    """The coordinator refused a request with ``status``; ``detail`` is its reason."""

    def __init__(self, status: int, detail: str, what: str) -> None:
        super().__init__(f"{what}: the coordinator answered {status}: {detail}")
        self.status = status
        self.detail = detail


def read_agent_token(path: Path, node: str) -> str:
    """The token agent ``node`` presents, from ``path``.

    ``path`` is either a tokens file (``admin TOKEN`` / ``node NAME TOKEN`` lines, ``#``
    comments) holding a ``node <node> TOKEN`` line, or a file whose only non-comment line is
    the token itself (what a Kubernetes Secret mounted per node holds). Raises UsageError when
    the file cannot be read or has no token for ``node``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read token file {path}: {e}") from e
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and ln.lstrip()[0] != "#"]
    if len(lines) == 1 and len(lines[0]) == 1:
        return lines[0][0]
    for words in lines:
        if len(words) == 3 and words[0] == "node" and words[1] == node:
            return words[2]
    nodes = sorted(w[1] for w in lines if len(w) == 3 and w[0] == "node")
    raise UsageError(
        f"{path} has no 'node {node} TOKEN' line (nodes in it: {', '.join(nodes) or 'none'}); "
        "give the coordinator's tokens file or a file holding just this node's token"
    )


@dataclass(frozen=True)
class Delivery:
    """What ``POST /v1/events`` answered: ids stored now and ids it already had."""

    accepted: tuple[str, ...]
    duplicates: tuple[str, ...]


class CoordinatorLink:
    """One agent's requests to the coordinator at ``url`` with ``token``.

    ``url`` may list several coordinator replicas (``URL,URL``): the link keeps to the one
    that answered last, and when it does not answer or answers 5xx (a standby refuses what
    only the leader holds: heartbeats, commands) the same request goes to the next at once;
    only when none takes it does the caller see CoordinatorUnavailableError (and retry).

    ``timeout_s`` bounds each ordinary request (seconds); a long poll gets its ``wait`` on
    top. Thread-safe (httpx clients are); give each long-polling thread its own link anyway so
    a held poll never delays an event.
    """

    def __init__(self, url: str, token: str, node: str, *, timeout_s: float = 10.0) -> None:
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not self.urls:
            raise UsageError("the coordinator's URL is empty")
        self.node = node
        self._timeout_s = timeout_s
        self._https = [
            httpx.Client(
                base_url=u, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s
            )
            for u in self.urls
        ]
        self._current = 0

    @property
    def url(self) -> str:
        """The replica this link talks to now."""
        return self.urls[self._current]

    def close(self) -> None:
        for http in self._https:
            http.close()

    def post_events(self, events: Sequence[HealthEvent]) -> Delivery:
        """Deliver ``events`` in one request; returns once the coordinator committed them.
        Raises CoordinatorUnavailableError (retry) or Refused (a verdict)."""
        body = '{"events":[' + ",".join(e.model_dump_json() for e in events) + "]}"
        doc = self._call(
            "POST", "/v1/events", "deliver events", content=body.encode(), json_body=True
        )
        return Delivery(tuple(doc.get("accepted", ())), tuple(doc.get("duplicates", ())))

    def heartbeat(self, version: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Tell the coordinator this agent is alive (not journaled)."""
        body = {"node": self.node, "version": version, **(extra or {})}
        result: dict[str, Any] = self._call("POST", "/v1/heartbeat", "heartbeat", json=body)
        return result

    def poll_commands(self, wait_s: float) -> list[dict[str, Any]]:
        """Commands waiting for this node; the coordinator holds the request up to ``wait_s``
        seconds when there are none."""
        doc = self._call(
            "GET",
            f"/v1/agents/{self.node}/commands",
            "poll commands",
            params={"wait": wait_s},
            timeout=self._timeout_s + wait_s,
        )
        commands: list[dict[str, Any]] = doc.get("commands", [])
        return commands

    def ack_command(self, command_id: str, result: dict[str, Any]) -> None:
        """Report that command ``command_id`` was carried out, with its ``result``."""
        self._call(
            "POST",
            f"/v1/agents/{self.node}/commands/{command_id}/ack",
            "acknowledge command",
            json=result,
        )

    def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        json_body: bool = False,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        headers = {"Content-Type": "application/json"} if json_body else None
        first = self._current
        failures = []
        for i in range(len(self.urls)):
            at = (first + i) % len(self.urls)
            try:
                r = self._https[at].request(
                    method,
                    path,
                    headers=headers,
                    timeout=timeout if timeout is not None else self._timeout_s,
                    **kwargs,
                )
            except httpx.TransportError as e:
                failures.append(
                    f"the coordinator at {self.urls[at]} does not answer ({type(e).__name__}: {e})"
                )
                continue
            if r.status_code in VERDICTS:
                self._current = at
                raise Refused(r.status_code, error_reason(r.text), what)
            if r.status_code >= 300:
                failures.append(
                    f"the coordinator at {self.urls[at]} answered {r.status_code}: "
                    + error_reason(r.text)
                )
                continue
            self._current = at
            return r.json()
        raise CoordinatorUnavailableError(f"{what}: " + "; ".join(failures))
