"""The durable intake: parse a request body into events, group-commit them, build the reply.

Group commit: each request appends its events to a pending list on the event loop and awaits a
future. One drain task at a time takes *everything* pending, commits it in one journal
transaction on a single writer thread, then resolves every waiting request at once. While one
commit runs (an fsync: a millisecond or more), the requests arriving meanwhile pile up and go
into the next one, so the number of fsyncs per second stays bounded by the disk while the
events per fsync grow with the load. No request is answered before its commit returned.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from recovery.coordinator.api import CoordinatorApi
from recovery.model import EventBatch, HealthEvent
from recovery.ports.clock import Clock
from recovery.ports.journal import Journal

log = logging.getLogger(__name__)

_BATCH_KEY = b'"events"'


def parse_events(body: bytes) -> list[HealthEvent]:
    """The events of a request body: one HealthEvent object or ``{"events": [...]}``.

    Validates the raw bytes (no intermediate ``dict``). Raises pydantic's ValidationError
    for whichever shape the body is closer to: a batch when its top-level object has an
    ``events`` key, else a single event.
    """
    # A single event never has an "events" key (extra fields are forbidden), so the cheap
    # substring test only picks which parse to try first; both are tried before giving up.
    batch_first = _BATCH_KEY in body
    first, second = (_batch, _single) if batch_first else (_single, _batch)
    try:
        return first(body)
    except ValidationError as e:
        first_error = e
    try:
        return second(body)
    except ValidationError as e:
        second_error = e
    raise first_error if _looks_like_batch(body) == batch_first else second_error


def _single(body: bytes) -> list[HealthEvent]:
    return [HealthEvent.model_validate_json(body)]


def _batch(body: bytes) -> list[HealthEvent]:
    return list(EventBatch.model_validate_json(body).events)


def _looks_like_batch(body: bytes) -> bool:
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and "events" in parsed


def field_errors(error: ValidationError) -> list[dict[str, Any]]:
    """FastAPI's 422 shape: ``loc`` (``["body", "events", 0, "fault"]``), ``msg``, ``type``."""
    return [
        {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in error.errors(include_url=False, include_input=False)
    ]


def reply_body(events: Sequence[HealthEvent], new: Sequence[bool]) -> bytes:
    """``{"accepted": [...], "duplicates": [...]}`` as bytes, built by hand: event ids match
    the schema's pattern (letters, digits, ``_ . : -``), so they need no JSON escaping."""
    accepted = '","'.join(e.id for e, n in zip(events, new, strict=True) if n)
    dups = '","'.join(e.id for e, n in zip(events, new, strict=True) if not n)
    return (
        '{"accepted":['
        + (f'"{accepted}"' if accepted else "")
        + '],"duplicates":['
        + (f'"{dups}"' if dups else "")
        + "]}"
    ).encode()


class GroupCommitter:
    """Commits the events of concurrent requests together; see the module docstring.

    ``observe(events, requests)`` is told the size of every commit. Must be used from one
    event loop. Failure mode: :meth:`commit` raises whatever the journal raised
    (JournalError) for every request of the failed transaction; nothing of it is stored.
    """

    def __init__(
        self,
        journal: Journal,
        coordinator: CoordinatorApi,
        clock: Clock,
        observe: Callable[[int, int], None],
    ) -> None:
        self._journal = journal
        self._coordinator = coordinator
        self._clock = clock
        self._observe = observe
        self._pending: list[tuple[list[HealthEvent], asyncio.Future[list[bool]]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def commit(self, events: list[HealthEvent]) -> list[bool]:
        """Durably store ``events``; returns True per new id, False per duplicate."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[bool]] = loop.create_future()
        self._pending.append((events, future))
        if self._drainer is None:
            # The task is kept referenced: the loop itself holds tasks only weakly.
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="journal-commit")
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                events = [e for evs, _ in batch for e in evs]
                try:
                    new = await loop.run_in_executor(self._executor, self._commit, events)
                except Exception as e:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(e)
                    continue
                self._observe(len(events), len(batch))
                start = 0
                for evs, future in batch:
                    if not future.done():  # a cancelled request: its events are stored anyway
                        future.set_result(new[start : start + len(evs)])
                    start += len(evs)
        finally:
            self._drainer = None

    def _commit(self, events: list[HealthEvent]) -> list[bool]:
        """On the writer thread: one transaction, then hand the new events to the engine."""
        new = self._journal.append_events(events, self._clock.now())
        fresh = [e for e, n in zip(events, new, strict=True) if n]
        if fresh:
            try:
                self._coordinator.submit(fresh)
            except Exception:
                # Already durable: the engine finds undecided events in the journal when it
                # (re)starts, so the request still succeeds.
                log.exception("coordinator.submit failed for %d committed event(s)", len(fresh))
        return new

    def close(self) -> None:
        """Stop the writer thread (after the commit in progress, if any)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
