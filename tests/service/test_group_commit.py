"""Group commit: requests that arrive while a commit runs go into the next one, together."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from recovery.errors import JournalError
from recovery.model import HealthEvent
from recovery.ports.clock import FakeClock, Stamp
from service.httpapi.intake import GroupCommitter
from service.journaldb.journal import SqliteJournal
from tests.service.helpers import FakeCoordinator, event


class GatedJournal:
    """Forwards to a real journal; the first append waits until the test opens the gate."""

    def __init__(self, journal: SqliteJournal) -> None:
        self.journal = journal
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[str]] = []

    def append_events(self, events: Sequence[HealthEvent], received: Stamp) -> list[bool]:
        self.batches.append([e.id for e in events])
        self.entered.set()
        self.gate.wait()
        return self.journal.append_events(events, received)

    def __getattr__(self, name: str) -> object:
        return getattr(self.journal, name)


async def _wait_for(flag: threading.Event) -> None:
    while not flag.is_set():  # the commit runs on another thread; poll the condition
        await asyncio.sleep(0.001)


def test_requests_waiting_on_a_commit_share_the_next_one(journal: SqliteJournal) -> None:
    gated = GatedJournal(journal)
    coordinator = FakeCoordinator()
    sizes: list[tuple[int, int]] = []
    committer = GroupCommitter(gated, coordinator, FakeClock(), lambda e, r: sizes.append((e, r)))  # type: ignore[arg-type]

    async def scenario() -> list[list[bool]]:
        first = asyncio.ensure_future(committer.commit([event(0)]))
        await _wait_for(gated.entered)  # commit #1 is in progress, holding the writer
        rest = [asyncio.ensure_future(committer.commit([event(i), event(0)])) for i in (1, 2, 3)]
        await asyncio.sleep(0)  # let them queue
        gated.gate.set()
        return [await first, *[await r for r in rest]]

    try:
        results = asyncio.run(scenario())
    finally:
        committer.close()
    assert gated.batches == [["ev-0"], ["ev-1", "ev-0", "ev-2", "ev-0", "ev-3", "ev-0"]]
    assert results == [[True], [True, False], [True, False], [True, False]]
    assert sizes == [(1, 1), (6, 3)]
    assert coordinator.submitted_ids() == ["ev-0", "ev-1", "ev-2", "ev-3"], "new ones only"


class FailingJournal:
    def append_events(self, events: Sequence[HealthEvent], received: Stamp) -> list[bool]:
        raise JournalError("disk full")


def test_a_failed_commit_fails_every_request_in_it() -> None:
    coordinator = FakeCoordinator()
    committer = GroupCommitter(FailingJournal(), coordinator, FakeClock(), lambda e, r: None)  # type: ignore[arg-type]

    async def scenario() -> list[BaseException | list[bool]]:
        calls = [committer.commit([event(i)]) for i in range(3)]
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        results = asyncio.run(scenario())
    finally:
        committer.close()
    assert [str(r) for r in results] == ["disk full"] * 3
    assert coordinator.submitted_ids() == []


class BrokenCoordinator(FakeCoordinator):
    def submit(self, events: Sequence[HealthEvent]) -> None:
        raise RuntimeError("engine stopped")


def test_a_failing_submit_still_acknowledges(
    journal: SqliteJournal, caplog: pytest.LogCaptureFixture
) -> None:
    committer = GroupCommitter(journal, BrokenCoordinator(), FakeClock(), lambda e, r: None)
    try:
        assert asyncio.run(committer.commit([event(1)])) == [True]
    finally:
        committer.close()
    assert [s.event.id for s in journal.undecided()] == ["ev-1"], "the engine finds it on restart"
    assert "coordinator.submit failed" in caplog.text
