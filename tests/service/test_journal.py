"""The journal on both backends (a real SQLite file; a real PostgreSQL server's database,
tests/plugins/postgres.py): every method of the Journal port."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from recovery.errors import JournalError, UsageError
from recovery.model import Decision, TakeDown, Verdict
from recovery.ports.clock import FakeClock, Stamp
from recovery.ports.journal import ActionStatus, IncidentStatus, JobPath, Journal, Phase, PhaseName
from service.journaldb.journal import SqliteJournal
from service.journaldb.sqljournal import SqlJournal
from tests.service.helpers import event, replace_decision


def test_it_is_the_journal_port(journal: SqlJournal) -> None:
    port: Journal = journal  # mypy checks the structural match; this checks it runs
    assert port.undecided() == []


def test_settings_make_every_commit_durable(journal: SqlJournal) -> None:
    if isinstance(journal, SqliteJournal):
        assert journal._writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert journal._writer.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        return
    with journal._read("read settings") as c:  # a commit waits for its WAL flush
        assert c.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        assert c.execute("SHOW fsync").fetchone()[0] == "on"


def test_append_reports_new_and_duplicate_ids(journal: SqlJournal, clock: FakeClock) -> None:
    first = clock.now()
    assert journal.append_events([event(1), event(2)], first) == [True, True]
    later = clock.advance(5)
    again = event(1, message="a resend with other content")
    assert journal.append_events([again, event(3), event(3)], later) == [False, True, False]
    stored = journal.undecided()
    assert [s.event.id for s in stored] == ["ev-1", "ev-2", "ev-3"]
    assert [s.seq for s in stored] == [1, 2, 3]
    assert stored[0].event == event(1), "the first copy stays"
    assert stored[0].received == first
    assert stored[2].received == later
    assert journal.append_events([], later) == []


def test_group_commit_of_many_events(journal: SqlJournal, clock: FakeClock) -> None:
    events = [event(i, node=f"n{i % 7}") for i in range(5000)]
    assert all(journal.append_events(events, clock.now()))
    assert [s.event for s in journal.undecided()] == events


def test_events_survive_reopening(tmp_path: Path, clock: FakeClock) -> None:
    j = SqliteJournal(tmp_path / "j.db", clock)
    j.append_events([event(1)], clock.now())
    j.set_meta("breaker-reset", "123")
    j.close()
    again = SqliteJournal(tmp_path / "j.db", clock)
    try:
        assert [s.event for s in again.undecided()] == [event(1)]
        assert again.get_meta("breaker-reset") == "123"
    finally:
        again.close()


def test_decision_opens_incident_and_plans_actions(
    journal: SqliteJournal, clock: FakeClock
) -> None:
    ev = event(1)
    journal.append_events([ev], clock.now())
    at = clock.advance(1)
    planned = journal.record_decision(replace_decision(ev, "inc-1"), at)
    assert [(a.action, a.status, a.incident, a.planned) for a in planned] == [
        (TakeDown("n1", reason="recover: xid79"), ActionStatus.planned, "inc-1", at),
        (replace_decision(ev, "inc-1").actions[1], ActionStatus.planned, "inc-1", at),
    ]
    assert planned[0].id < planned[1].id
    assert journal.undecided() == []
    assert journal.pending_actions() == planned
    assert journal.held_actions() == []
    inc = journal.incident("inc-1")
    assert (inc.node, inc.fault, inc.verdict, inc.status) == ("n1", "xid79", "replace", "open")
    assert inc.opened == at
    assert inc.closed is None
    assert inc.event_ids == ("ev-1",)
    assert [(p.name, p.at) for p in inc.phases] == [("decided", at)]
    assert inc.actions == tuple(planned)
    ((stored, decision),) = journal.history()
    assert stored.decided
    assert decision == replace_decision(ev, "inc-1")


def test_held_decision_plans_held_actions(journal: SqlJournal, clock: FakeClock) -> None:
    ev = event(1)
    journal.append_events([ev], clock.now())
    held = journal.record_decision(replace_decision(ev, "inc-1", held=True), clock.now())
    assert {a.status for a in held} == {ActionStatus.held}
    assert journal.held_actions() == held
    assert journal.pending_actions() == []


def test_deciding_again_changes_nothing(journal: SqlJournal, clock: FakeClock) -> None:
    ev = event(1)
    journal.append_events([ev], clock.now())
    first = journal.record_decision(replace_decision(ev, "inc-1"), clock.now())
    again = journal.record_decision(replace_decision(ev, "inc-1"), clock.advance(9))
    assert again == first
    assert len(journal.pending_actions()) == 2


def test_joining_an_incident_raises_its_verdict(journal: SqlJournal, clock: FakeClock) -> None:
    a, b = event(1, fault="xid13"), event(2)
    journal.append_events([a, b], clock.now())
    mild = Decision(a.id, a.node, a.fault, Verdict.restart_app, incident="inc-1", opens=True)
    journal.record_decision(mild, clock.now())
    assert journal.incident("inc-1").verdict == "restart-app"
    journal.record_decision(replace_decision(b, "inc-1"), clock.advance(1))
    inc = journal.incident("inc-1")
    assert inc.verdict == "replace"
    assert inc.fault == "xid13", "the fault that opened it"
    assert inc.event_ids == ("ev-1", "ev-2")
    assert len(inc.phases) == 1, "decided is recorded once, at the first decision"


def test_ignored_event_is_decided_without_incident(
    journal: SqliteJournal, clock: FakeClock
) -> None:
    ev = event(1, fault="xid43")
    journal.append_events([ev], clock.now())
    assert (
        journal.record_decision(Decision(ev.id, ev.node, ev.fault, Verdict.ignore), clock.now())
        == []
    )
    assert journal.undecided() == []
    assert journal.incidents() == []
    assert journal.history()[0][1] == Decision(ev.id, ev.node, ev.fault, Verdict.ignore)


@pytest.mark.parametrize(
    ("decision", "message"),
    [
        (Decision("ev-9", "n1", "xid79", Verdict.ignore), "not in the journal"),
        (
            Decision("ev-1", "n1", "xid79", Verdict.replace_node, actions=(TakeDown("n1"),)),
            "names no incident",
        ),
    ],
)
def test_bad_decisions_are_refused_and_leave_nothing(
    journal: SqliteJournal, clock: FakeClock, decision: Decision, message: str
) -> None:
    journal.append_events([event(1)], clock.now())
    with pytest.raises(JournalError, match=message):
        journal.record_decision(decision, clock.now())
    assert len(journal.undecided()) == 1
    assert journal.pending_actions() == []
    assert journal.incidents() == []


def test_outcomes(journal: SqlJournal, clock: FakeClock) -> None:
    ev = event(1)
    journal.append_events([ev], clock.now())
    down, promote = journal.record_decision(replace_decision(ev, "inc-1"), clock.now())
    done_at = clock.advance(2)
    journal.record_outcome(down.id, ActionStatus.done, done_at, detail="DOWN", attempts=2)
    journal.record_outcome(promote.id, ActionStatus.waiting, clock.advance(1), detail="no spare")
    (waiting,) = journal.pending_actions()
    assert (waiting.id, waiting.status, waiting.detail, waiting.finished) == (
        promote.id,
        ActionStatus.waiting,
        "no spare",
        None,
    )
    done = journal.incident("inc-1").actions[0]
    assert (done.status, done.attempts, done.detail, done.finished) == (
        ActionStatus.done,
        2,
        "DOWN",
        done_at,
    )
    with pytest.raises(JournalError, match="no action with id 999"):
        journal.record_outcome(999, ActionStatus.done, clock.now())


def _open_incident(journal: SqlJournal, clock: FakeClock, i: int = 1) -> str:
    ev = event(i)
    journal.append_events([ev], clock.now())
    journal.record_decision(replace_decision(ev, f"inc-{i}"), clock.now())
    return f"inc-{i}"


def test_phases_keep_the_first_instant(journal: SqlJournal, clock: FakeClock) -> None:
    inc = _open_incident(journal, clock)
    first = clock.advance(3)
    assert journal.add_phase(inc, Phase(PhaseName.node_down, first, "scontrol ok"))
    assert not journal.add_phase(inc, Phase(PhaseName.node_down, clock.advance(1), "again"))
    phases = journal.incident(inc).phases
    assert [(p.name, p.at, p.detail) for p in phases][1:] == [("node-down", first, "scontrol ok")]
    assert all(isinstance(p.name, PhaseName) for p in phases)  # read back typed


def test_a_phase_name_is_one_of_the_vocabulary() -> None:
    assert Phase("node-down", Stamp(1.0, 1.0)).name is PhaseName.node_down  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node-dwn"):
        Phase("node-dwn", Stamp(1.0, 1.0))  # type: ignore[arg-type]


def test_update_incident_sets_jobs_and_merges_info(
    journal: SqliteJournal, clock: FakeClock
) -> None:
    inc = _open_incident(journal, clock)
    journal.update_incident(
        inc, jobs=["12", "13"], info={"path": JobPath.down_requeue, "spare": None}
    )
    journal.update_incident(inc, info={"spare": "s1"})
    journal.update_incident(inc, jobs=["14"])
    record = journal.incident(inc)
    assert record.jobs == ("14",)
    assert record.info == {
        "path": "down-requeue (no save: the node cannot run the job)",
        "spare": "s1",
    }


def test_close_once(journal: SqlJournal, clock: FakeClock) -> None:
    one, two = _open_incident(journal, clock, 1), _open_incident(journal, clock, 2)
    at = clock.advance(60)
    assert journal.close_incident(one, at, "job running")
    assert not journal.close_incident(one, clock.advance(1))
    closed = journal.incident(one)
    assert closed.status == IncidentStatus.closed
    assert closed.closed == at
    assert closed.phases[-1] == Phase(PhaseName.closed, at, "job running")
    assert [i.id for i in journal.incidents()] == [one, two]
    assert [i.id for i in journal.incidents(open_only=True)] == [two]


@pytest.mark.parametrize(
    "call",
    [
        lambda j, at: j.incident("inc-404"),
        lambda j, at: j.add_phase("inc-404", Phase(PhaseName.received, at)),
        lambda j, at: j.update_incident("inc-404", jobs=[]),
        lambda j, at: j.close_incident("inc-404", at),
    ],
)
def test_unknown_incident_names_how_to_list(journal: SqlJournal, clock: FakeClock, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match=r"Unknown incident 'inc-404'.*GET /v1/incidents"):
        call(journal, clock.now())


def test_meta(journal: SqlJournal) -> None:
    assert journal.get_meta("k") is None
    journal.set_meta("k", "1")
    journal.set_meta("k", "2")
    assert journal.get_meta("k") == "2"


def test_events_by_id(journal: SqlJournal, clock: FakeClock) -> None:
    journal.append_events([event(i) for i in range(1200)], clock.now())
    got = journal.events_by_id([f"ev-{i}" for i in (1100, 3, 700)] + ["nope"])
    assert [s.event.id for s in got] == ["ev-3", "ev-700", "ev-1100"]


def test_closed_journal_refuses(tmp_path: Path, clock: FakeClock) -> None:
    j = SqliteJournal(tmp_path / "j.db", clock)
    j.close()
    j.close()
    with pytest.raises(JournalError, match="is closed"):
        j.append_events([event(1)], clock.now())
    with pytest.raises(JournalError, match="is closed"):
        j.undecided()


def test_a_file_that_is_not_a_journal(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "j.db"
    path.write_bytes(b"certainly not SQLite " * 100)
    with pytest.raises(JournalError, match=r"cannot open") as info:
        SqliteJournal(path, clock)
    assert isinstance(info.value.__cause__, sqlite3.Error)


def test_checkpoints_run_off_the_commit_path(tmp_path: Path, clock: FakeClock) -> None:
    j = SqliteJournal(tmp_path / "j.db", clock, checkpoint_every_s=0.01)
    try:
        assert j._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        j.append_events([event(i) for i in range(2000)], clock.now())
        assert j._checkpointer is not None
        deadline = time.monotonic() + 30
        while j._checkpointer.checkpoints < 2:  # wait on the condition, not a fixed time
            assert time.monotonic() < deadline, "no checkpoint ran"
            time.sleep(0.005)
        assert len(j.undecided()) == 2000
    finally:
        j.close()
    assert not any(t.name == "journal-checkpoint" for t in threading.enumerate())


def test_checkpoints_can_be_left_to_sqlite(tmp_path: Path, clock: FakeClock) -> None:
    j = SqliteJournal(tmp_path / "j.db", clock, checkpoint_every_s=None)
    try:
        assert j._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        assert j._checkpointer is None
    finally:
        j.close()
