"""Delivery of spooled events to the coordinator: at least once, exactly once in effect.

The order that makes it lose nothing:

1. a source's event is made durable by :meth:`agents.spool.Spool.put` before anything is sent;
2. the publisher sends spooled events oldest first, in batches (``POST /v1/events``), which the
   coordinator answers only once they are committed to its journal;
3. only after a 2xx answer are the ids it names (``accepted`` and ``duplicates`` alike) removed
   from the spool with :meth:`~agents.spool.Spool.ack`.

A coordinator outage or an agent killed at any point therefore leaves every unacknowledged
event in the spool, and it is sent again; the coordinator stores an id once and answers later
copies as duplicates, so the journal ends up with each event exactly once.

What is retried and what is not (recovery.errors): no connection, a timeout, a 5xx or 429 is
retried with exponential backoff, for as long as it takes (an outage must not lose events).
A refusal (401, 403, 413, 422, ...) is a verdict on the event: it is moved to the
``rejected/`` folder next to the spool with the coordinator's reason, logged, and acknowledged,
so one bad event neither blocks the rest nor is retried forever nor vanishes unexplained. A
refused batch is split to find which events the verdict is about.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agents.link import Delivery, Refused
from agents.spool import Spool
from recovery.errors import TransientError
from recovery.fsutil import atomic_write
from recovery.model import HealthEvent
from recovery.retry import Backoff

Log = Callable[[str], None]
#: Events per request: large enough to empty a flood's backlog quickly, well under the intake's
#: 10,000-event batch limit and 1 MB body limit (an event is 300-2,500 bytes of JSON).
DEFAULT_BATCH = 200
#: Retries never give up (``attempts`` is effectively unbounded); waits grow 0.1 s -> 5 s.
DEFAULT_BACKOFF = Backoff(attempts=2**31, initial_s=0.1, factor=2.0, max_s=5.0)
REJECTED_DIR = "rejected"


class EventSink(Protocol):
    """Where events go (:class:`agents.link.CoordinatorLink`)."""

    def post_events(self, events: Sequence[HealthEvent]) -> Delivery: ...


@dataclass
class RejectedStore:
    """Events the coordinator refused, one JSON file each in ``directory``: ``{"status",
    "reason", "rejected_at", "event"}``; a person (or ``recover agent ...`` later) decides what
    becomes of them. Written atomically and fsynced, before the event leaves the spool."""

    directory: Path
    clock: Callable[[], float] = time.time

    def keep(self, event: HealthEvent, status: int, reason: str) -> Path:
        """Store ``event`` with the verdict; returns its file. Raises OSError (disk)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", event.id) + ".json"
        doc = {
            "status": status,
            "reason": reason,
            "rejected_at": self.clock(),
            "event": event.model_dump(mode="json"),
        }
        path = self.directory / name
        atomic_write(path, json.dumps(doc, indent=1).encode())
        return path

    def ids(self) -> list[str]:
        """The ids of the events kept here."""
        if not self.directory.is_dir():
            return []
        out = []
        for p in sorted(self.directory.glob("*.json")):
            out.append(str(json.loads(p.read_text())["event"]["id"]))
        return out


@dataclass
class Stats:
    """What the publisher did since it started (for logs and tests)."""

    sent: int = 0
    duplicates: int = 0
    rejected: int = 0
    requests: int = 0
    failures: int = 0
    last_error: str = ""
    delivered_at: float | None = None
    """When (monotonic seconds) a batch was last delivered: accepted or known already."""


@dataclass
class Publisher:
    """Sends what ``spool`` holds to ``sink``; see the module docstring for the guarantees.

    ``wait(seconds) -> bool`` sleeps between retries and returns True when the publisher
    should stop (by default a wait on the stop event given to :meth:`run`); tests pass a fake.
    Only one publisher may drain a spool.
    """

    spool: Spool
    sink: EventSink
    rejected: RejectedStore
    batch: int = DEFAULT_BATCH
    backoff: Backoff = DEFAULT_BACKOFF
    log: Log = print
    stats: Stats = field(default_factory=Stats)

    def send_pending(self) -> int:
        """One pass: send everything spooled now, batch by batch. Returns how many events left
        the spool. Raises TransientError on the first batch that could not be delivered (what
        was delivered before it stays acknowledged)."""
        done = 0
        while True:
            batch = [s.event for s in self.spool.pending(limit=self.batch)]
            if not batch:
                return done
            done += self._deliver(batch)

    def run(
        self,
        stop: threading.Event,
        wake: threading.Event,
        *,
        idle_s: float = 1.0,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        """Deliver until ``stop`` is set: after each ``wake`` (set it when an event was spooled)
        or every ``idle_s`` seconds; back off while the coordinator is unavailable."""
        pause = wait or stop.wait
        failures = 0
        while not stop.is_set():
            wake.clear()
            try:
                self.send_pending()
            except TransientError as e:
                failures += 1
                self.stats.failures += 1
                delay = self.backoff.wait_s(min(failures, 64), e)
                if failures == 1 or failures % 20 == 0:  # not one line per retry in an outage
                    self.log(
                        f"publisher: {e}; {len(self.spool)} event(s) kept in the spool, "
                        f"retrying (attempt {failures}, next in {delay:.1f} s)"
                    )
                if pause(delay):
                    return
                continue
            if failures:
                self.log(f"publisher: coordinator reachable again after {failures} failure(s)")
                failures = 0
            wake.wait(idle_s)

    # --- internals -----------------------------------------------------------------------

    def _deliver(self, batch: list[HealthEvent]) -> int:
        self.stats.requests += 1
        try:
            reply = self.sink.post_events(batch)
        except TransientError as e:
            self.stats.last_error = str(e)
            raise
        except Refused as e:
            return self._refused(batch, e)
        self.stats.delivered_at = time.monotonic()
        done = 0
        for eid in (*reply.accepted, *reply.duplicates):
            done += self.spool.ack(eid)
        self.stats.sent += len(reply.accepted)
        self.stats.duplicates += len(reply.duplicates)
        missing = {e.id for e in batch} - {*reply.accepted, *reply.duplicates}
        if missing:  # a coordinator bug; keep them and say so rather than loop silently
            raise TransientError(
                f"the coordinator's answer did not name {len(missing)} event(s) it was sent, "
                f"e.g. {sorted(missing)[0]}"
            )
        return done

    def _refused(self, batch: list[HealthEvent], error: Refused) -> int:
        # A whole batch is refused for one bad event (422, 403) or for its size (413): split it
        # so the verdict lands on the events it is about. 401 concerns the token, not an
        # event: splitting would only repeat it.
        if len(batch) > 1 and error.status != 401:
            half = len(batch) // 2
            return self._deliver(batch[:half]) + self._deliver(batch[half:])
        for event in batch:
            path = self.rejected.keep(event, error.status, error.detail)
            self.spool.ack(event.id)
            self.stats.rejected += 1
            self.log(
                f"publisher: the coordinator refused event {event.id} ({event.fault} on "
                f"{event.node}) with {error.status}: {error.detail}; kept in {path}, not retried"
            )
        return len(batch)
