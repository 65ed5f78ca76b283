"""One journal used by several threads at once: writers serialised, readers never blocked."""

from __future__ import annotations

import threading

import pytest

from recovery.ports.clock import FakeClock
from service.journaldb.journal import SqliteJournal
from tests.service.helpers import event, replace_decision

WRITERS, PER_WRITER, READERS = 4, 150, 3


@pytest.mark.slow
def test_concurrent_writers_and_readers(journal: SqliteJournal, clock: FakeClock) -> None:
    errors: list[BaseException] = []
    done = threading.Event()
    seen_counts: list[list[int]] = [[] for _ in range(READERS)]

    def write(w: int) -> None:
        try:
            for i in range(PER_WRITER):
                ev = event(f"{w}-{i}", node=f"n{w}")
                # The same id from two writers: exactly one of them stores it.
                shared = event(f"shared-{i}")
                journal.append_events([ev, shared], clock.now())
                if i % 10 == 0:
                    journal.record_decision(replace_decision(ev, f"inc-{w}-{i}"), clock.now())
        except BaseException as e:
            errors.append(e)

    def read(r: int) -> None:
        try:
            while not done.is_set():
                seen_counts[r].append(len(journal.history()))
                journal.undecided()
                journal.incidents(open_only=True)
                journal.pending_actions()
        except BaseException as e:
            errors.append(e)

    writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    readers = [threading.Thread(target=read, args=(r,)) for r in range(READERS)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in readers:
        t.join()

    assert errors == []
    history = journal.history()
    ids = [s.event.id for s, _ in history]
    assert len(ids) == len(set(ids)) == WRITERS * PER_WRITER + PER_WRITER
    assert [s.seq for s, _ in history] == list(range(1, len(ids) + 1))
    assert len(journal.incidents()) == WRITERS * PER_WRITER // 10
    assert len(journal.pending_actions()) == 2 * WRITERS * PER_WRITER // 10
    for counts in seen_counts:
        assert counts, "every reader read at least once"
        assert counts == sorted(counts), "a reader never sees the journal go back in time"
