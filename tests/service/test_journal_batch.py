"""The journal's batch, on both backends: many writes, one commit; each write still atomic by
itself."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest

from recovery.errors import JournalError
from recovery.ports.clock import FakeClock
from recovery.ports.journal import ActionStatus, Phase, PhaseName
from service.journaldb import plan
from service.journaldb.journal import SqliteJournal
from service.journaldb.pgjournal import PostgresJournal
from service.journaldb.sqljournal import SqlJournal
from tests.service.helpers import event, replace_decision


def _commits(journal: SqlJournal) -> list[str]:
    """Every COMMIT the journal's writer sends from now on."""
    seen: list[str] = []
    if isinstance(journal, SqliteJournal):
        journal._writer.set_trace_callback(
            lambda sql: seen.append(sql) if sql.strip().upper() == "COMMIT" else None
        )
        return seen
    assert isinstance(journal, PostgresJournal)
    sent = journal._control

    def control(conn: Any, statement: str) -> None:
        if statement == "COMMIT":
            seen.append(statement)
        sent(conn, statement)

    journal._control = control  # type: ignore[method-assign]
    return seen


def _stored_ids(journal: SqlJournal) -> list[str]:
    # A connection of its own: it sees only what was committed.
    sql = "SELECT event_id FROM decisions ORDER BY event_id"
    if isinstance(journal, SqliteJournal):
        with sqlite3.connect(journal.path) as conn:
            return [r[0] for r in conn.execute(sql)]
    assert isinstance(journal, PostgresJournal)
    with psycopg.connect(journal.dsn) as pg:
        return [r[0] for r in pg.execute(sql)]


def test_the_writes_of_a_batch_commit_once_at_its_end(
    journal: SqlJournal, clock: FakeClock
) -> None:
    events = [event(i, node=f"n{i}") for i in range(3)]
    journal.append_events(events, clock.now())
    commits = _commits(journal)
    with journal.batch():
        for i, ev in enumerate(events):
            journal.record_decision(replace_decision(ev, f"inc-{i}"), clock.now())
            journal.add_phase(f"inc-{i}", Phase(PhaseName.received, clock.now()))
        assert _stored_ids(journal) == [], "nothing is committed inside the batch"
        assert commits == []
    assert len(commits) == 1
    assert _stored_ids(journal) == ["ev-0", "ev-1", "ev-2"]
    assert [r.status for r in journal.pending_actions()] == [ActionStatus.planned] * 6


def test_a_failing_write_leaves_nothing_and_the_batch_goes_on(
    journal: SqlJournal, clock: FakeClock
) -> None:
    journal.append_events([event(1), event(2, node="n2")], clock.now())
    with journal.batch():
        journal.record_decision(replace_decision(event(1), "inc-1"), clock.now())
        with pytest.raises(JournalError, match="not in the journal"):
            journal.record_decision(replace_decision(event(9), "inc-9"), clock.now())
        journal.record_decision(replace_decision(event(2, node="n2"), "inc-2"), clock.now())
    assert _stored_ids(journal) == ["ev-1", "ev-2"]
    assert [i.id for i in journal.incidents()] == ["inc-1", "inc-2"]


def test_what_was_written_before_an_exception_is_committed(
    journal: SqlJournal, clock: FakeClock
) -> None:
    journal.append_events([event(1)], clock.now())

    def decide_then_fail() -> None:
        with journal.batch():
            journal.record_decision(replace_decision(event(1), "inc-1"), clock.now())
            raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        decide_then_fail()
    assert _stored_ids(journal) == ["ev-1"]
    assert journal.undecided() == []


def test_a_nested_batch_joins_the_outer_one(journal: SqlJournal, clock: FakeClock) -> None:
    commits = _commits(journal)
    with journal.batch():
        journal.append_events([event(1)], clock.now())
        with journal.batch():
            journal.append_events([event(2)], clock.now())
        assert commits == []
    assert len(commits) == 1
    assert [s.event.id for s in journal.undecided()] == ["ev-1", "ev-2"]


def test_writes_outside_a_batch_still_commit_one_by_one(
    journal: SqlJournal, clock: FakeClock
) -> None:
    commits = _commits(journal)
    journal.append_events([event(1)], clock.now())
    journal.append_events([event(2)], clock.now())
    assert len(commits) == 2


def test_a_closed_journal_refuses_a_batch(journal: SqlJournal) -> None:
    journal.close()
    with pytest.raises(JournalError, match="closed"), journal.batch():
        pass


def test_a_write_failing_halfway_is_undone_inside_the_batch(
    journal: SqlJournal, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal.append_events([event(1), event(2, node="n2")], clock.now())

    def broken(*_args: object) -> None:
        if isinstance(journal, SqliteJournal):
            raise sqlite3.OperationalError("disk I/O error")
        raise psycopg.OperationalError("disk I/O error")

    with journal.batch():
        journal.record_decision(replace_decision(event(1), "inc-1"), clock.now())
        with monkeypatch.context() as m:
            # Fails after the incident was opened and the decision stored.
            m.setattr(plan, "plan_actions", broken)
            with pytest.raises(JournalError, match="disk I/O error"):
                journal.record_decision(replace_decision(event(2, node="n2"), "inc-2"), clock.now())
    assert _stored_ids(journal) == ["ev-1"]
    assert [i.id for i in journal.incidents()] == ["inc-1"]
    assert [s.event.id for s in journal.undecided()] == ["ev-2"]
