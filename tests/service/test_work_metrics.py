"""The coordinator's work as metrics (``service.httpapi.workmetrics``): a real SQLite journal
behind the metering one, writes counted as the engine would make them, and ``/metrics``
served by a real server, parsed with prometheus_client's own parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from recovery.ports.clock import FakeClock
from recovery.ports.journal import ActionStatus, Phase, PhaseName
from service.httpapi.app import create_app
from service.httpapi.server import ServerThread
from service.httpapi.workmetrics import MeteredJournal, StateCollector, WorkMetrics
from service.journaldb.journal import SqliteJournal
from tests.helpers import promtool_passes
from tests.service.helpers import (
    ADMIN_TOKEN,
    FakeCoordinator,
    auth,
    event,
    replace_decision,
    tokens,
)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def _metered(tmp_path: Path) -> tuple[MeteredJournal, SqliteJournal, WorkMetrics, FakeClock]:
    clock = FakeClock()
    store = SqliteJournal(tmp_path / "j.db", clock, checkpoint_every_s=None)
    work = WorkMetrics()
    return MeteredJournal(store, work), store, work, clock


def test_decisions_actions_phases_and_commits_are_counted(tmp_path: Path) -> None:
    journal, store, work, clock = _metered(tmp_path)
    registry = CollectorRegistry()
    work.register(registry)
    ev = event(1)
    assert journal.append_events([ev], clock.now()) == [True]
    down, promote = journal.record_decision(replace_decision(ev, "inc-1"), clock.now())
    clock.advance(0.2)
    journal.add_phase("inc-1", Phase(PhaseName.node_down, clock.now(), "DOWN"))
    journal.record_outcome(down.id, ActionStatus.done, clock.now(), detail="ok")
    journal.record_outcome(promote.id, ActionStatus.waiting, clock.now(), detail="no spare")
    clock.advance(3.0)
    journal.record_outcome(promote.id, ActionStatus.done, clock.now(), detail="spare1")
    assert not journal.add_phase("inc-1", Phase(PhaseName.node_down, clock.now(), "again"))
    assert journal.close_incident("inc-1", clock.now())

    assert _value(registry, "recover_decisions_total", verdict="replace", fault="xid79") == 1
    assert _value(registry, "recover_actions_total", kind="down", outcome="done") == 1
    assert _value(registry, "recover_actions_total", kind="promote", outcome="waiting") == 1
    assert _value(registry, "recover_actions_total", kind="promote", outcome="done") == 1
    # planned -> ended: the down 0.2 s, the promotion 3.2 s (its wait counted in)
    got = _value(registry, "recover_action_duration_seconds_sum", kind="down")
    assert got == pytest.approx(0.2)
    got = _value(registry, "recover_action_duration_seconds_sum", kind="promote")
    assert got == pytest.approx(3.2)
    assert _value(registry, "recover_action_duration_seconds_count", kind="promote") == 1
    # a phase counts once, the first time, from the incident's opening
    assert _value(registry, "recover_incident_phase_seconds_count", phase="node-down") == 1
    got = _value(registry, "recover_incident_phase_seconds_sum", phase="node-down")
    assert got == pytest.approx(0.2)
    assert _value(registry, "recover_incidents_closed_total") == 1
    for write in ("events", "decision", "outcome", "phase", "incident"):
        assert _value(registry, "recover_journal_commit_duration_seconds_count", write=write) > 0
    # and everything reached the journal underneath
    (inc,) = store.incidents()
    assert inc.status == "closed"
    assert [a.status for a in inc.actions] == [ActionStatus.done, ActionStatus.done]


def test_an_action_planned_before_a_restart_is_counted_by_its_kind(tmp_path: Path) -> None:
    """A coordinator started again finishes what the one before planned: the outcome is
    counted by the action's kind (read from the journal), with no duration (the planning
    stamp's monotonic clock may be another boot's); a phase still times from the opening."""
    clock = FakeClock()
    store = SqliteJournal(tmp_path / "j.db", clock, checkpoint_every_s=None)
    ev = event(1)
    store.append_events([ev], clock.now())
    down, _promote = store.record_decision(replace_decision(ev, "inc-1"), clock.now())
    work = WorkMetrics()
    registry = CollectorRegistry()
    work.register(registry)
    journal = MeteredJournal(store, work)  # the new process
    clock.advance(1.5)
    journal.record_outcome(down.id, ActionStatus.done, clock.now())
    journal.add_phase("inc-1", Phase(PhaseName.node_down, clock.now(), "DOWN"))
    assert _value(registry, "recover_actions_total", kind="down", outcome="done") == 1
    assert _value(registry, "recover_action_duration_seconds_count", kind="down") == 0
    got = _value(registry, "recover_incident_phase_seconds_sum", phase="node-down")
    assert got == pytest.approx(1.5)


def test_the_state_is_read_at_each_scrape() -> None:
    class Inc:
        def __init__(self, fault: str) -> None:
            self.fault = fault

    open_now: list[Any] = [Inc("xid79"), Inc("xid79"), Inc("node-slow")]
    nodes = [{"name": "node1", "suspect": False}, {"name": "node2", "suspect": True}]
    status = {"spares": ["spare1", "spare2"], "breaker": {"tripped": True}, "nodes": nodes}
    registry = CollectorRegistry()
    registry.register(StateCollector(lambda: open_now, lambda: status))
    assert _value(registry, "recover_open_incidents_by_fault", fault="xid79") == 2
    assert _value(registry, "recover_open_incidents_by_fault", fault="node-slow") == 1
    assert _value(registry, "recover_spares_ready") == 2
    assert _value(registry, "recover_breaker_tripped") == 1
    assert _value(registry, "recover_agent_silent", node="node1") == 0
    assert _value(registry, "recover_agent_silent", node="node2") == 1
    open_now.clear()
    status = {"spares": [], "breaker": {"tripped": False}, "nodes": nodes[:1]}
    assert _value(registry, "recover_open_incidents_by_fault", fault="xid79") == 0
    assert _value(registry, "recover_spares_ready") == 0
    assert _value(registry, "recover_breaker_tripped") == 0
    assert registry.get_sample_value("recover_agent_silent", {"node": "node2"}) is None


def test_every_action_kinds_ended_outcomes_are_there_at_zero_before_any() -> None:
    """An alert on ``increase(recover_actions_total[...])`` needs the series before its
    first take-out: one born at 1 has nothing earlier to increase from."""
    work = WorkMetrics()
    registry = CollectorRegistry()
    work.register(registry)
    for kind in ("down", "drain", "save-requeue", "requeue", "promote", "retire"):
        for outcome in ("done", "failed"):
            labels = {"kind": kind, "outcome": outcome}
            assert registry.get_sample_value("recover_actions_total", labels) == 0


def test_the_scrape_serves_the_work_beside_the_intake(tmp_path: Path) -> None:
    journal, store, work, clock = _metered(tmp_path)
    app: Any = create_app(journal=journal, tokens=tokens(), coordinator=FakeCoordinator(),
                          clock=clock, work=work)  # fmt: skip
    ev = event(7)
    journal.append_events([ev], clock.now())
    journal.record_decision(replace_decision(ev, "inc-7"), clock.now())
    try:
        with ServerThread(app) as server, httpx.Client(base_url=server.url) as client:
            text = client.get("/metrics").text
            # An incident's page still finds its events through the metering journal.
            page = client.get("/v1/incidents/inc-7", headers=auth(ADMIN_TOKEN)).json()
    finally:
        store.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("recover_decisions", "recover_actions", "recover_action_duration_seconds",
                 "recover_incident_phase_seconds", "recover_journal_commit_duration_seconds",
                 "recover_open_incidents_by_fault", "recover_spares_ready",
                 "recover_breaker_tripped", "recover_agent_silent", "recover_intake_events",
                 "recover_open_incidents"):  # fmt: skip
        assert name in families, sorted(families)
    (sample,) = [s for s in families["recover_open_incidents_by_fault"].samples]
    assert (sample.labels, sample.value) == ({"fault": "xid79"}, 1.0)
    assert [e["event"]["id"] for e in page["events"]] == ["ev-7"]
    promtool_passes(text)
