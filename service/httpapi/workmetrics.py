"""Metrics of the coordinator's work, beside the intake's (:mod:`service.httpapi.metrics`):
decisions, actions and how long they took, how far incidents got and how soon, what the
journal's commits cost, and (read at each scrape) open incidents by fault, ready spares and
the breaker.

Everything the coordinator does is written to its journal first, so the counting is done by
:class:`MeteredJournal`, a journal that passes every call through and counts the writes: the
engine, the executor, the reconcile steps and the intake need no metrics code of their own.
Counters start at zero with each process (Prometheus' ``rate`` and ``increase`` handle the
reset); the journal keeps the history.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from recovery.coordinator.replica import NotLeader, Role
from recovery.model import Decision, HealthEvent
from recovery.model.actions import ACTION_TYPES
from recovery.ports.clock import Stamp
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    IncidentInfo,
    IncidentRecord,
    Journal,
    Phase,
    StoredEvent,
)

#: Action latencies: a drain takes tens of milliseconds; a promotion that waits for a spare's
#: check, or a save before a requeue, takes seconds to minutes.
ACTION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
#: Seconds from an incident's opening to each phase: detection is sub-second, a requeued
#: job's restart tens of seconds, a repair hours.
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 14400)
#: A journal commit: a synced SQLite write is a few milliseconds, a slow disk's seconds.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: Action statuses that end an action (a waiting or held one is not over).
_ENDED = frozenset({ActionStatus.done, ActionStatus.failed})


class WorkMetrics:
    """The counters and histograms of the coordinator's work (registered with
    :meth:`register`)."""

    def __init__(self) -> None:
        self.decisions = Counter(
            "recover_decisions", "Decisions committed, by verdict and fault",
            ["verdict", "fault"], registry=None,
        )  # fmt: skip
        self.actions = Counter(
            "recover_actions", "Action outcomes recorded, by kind and outcome",
            ["kind", "outcome"], registry=None,
        )  # fmt: skip
        self.action_seconds = Histogram(
            "recover_action_duration_seconds",
            "From an action planned to its outcome (done or failed), by kind",
            ["kind"], buckets=ACTION_BUCKETS, registry=None,
        )  # fmt: skip
        self.phase_seconds = Histogram(
            "recover_incident_phase_seconds",
            "From an incident's opening to each phase it reached, by phase",
            ["phase"], buckets=PHASE_BUCKETS, registry=None,
        )  # fmt: skip
        self.commit_seconds = Histogram(
            "recover_journal_commit_duration_seconds",
            "Journal writes (each durable when it returns), by what was written",
            ["write"], buckets=COMMIT_BUCKETS, registry=None,
        )  # fmt: skip
        self.incidents_closed = Counter(
            "recover_incidents_closed", "Incidents closed", registry=None
        )
        # Every kind's ended outcomes exist from the start, at 0: an alert on
        # ``increase(recover_actions_total[...])`` sees the first take-out after a restart
        # (a series born at 1 has no earlier sample to increase from).
        for kind in sorted(ACTION_TYPES):
            for outcome in sorted(_ENDED):
                self.actions.labels(kind, outcome.value)

    def register(self, registry: CollectorRegistry) -> None:
        for metric in (self.decisions, self.actions, self.action_seconds, self.phase_seconds,
                       self.commit_seconds, self.incidents_closed):  # fmt: skip
            registry.register(metric)


class MeteredJournal:
    """``journal``, its writes counted in ``metrics``. Reads pass through unchanged."""

    def __init__(self, journal: Journal, metrics: WorkMetrics) -> None:
        self._journal = journal
        self._metrics = metrics
        self._lock = threading.Lock()
        self._planned: dict[int, tuple[str, float]] = {}
        """Action id -> (kind, planned monotonic): kept until the action ends."""
        self._opened: dict[str, float] = {}
        """Incident id -> opened (monotonic), for the phases' times."""

    # --- the reads, passed through ------------------------------------------------------

    def undecided(self) -> list[StoredEvent]:
        return self._journal.undecided()

    def batch(self) -> AbstractContextManager[None]:
        return self._journal.batch()

    def pending_actions(self) -> list[ActionRecord]:
        return self._journal.pending_actions()

    def held_actions(self) -> list[ActionRecord]:
        return self._journal.held_actions()

    def incidents(self, *, open_only: bool = False) -> list[IncidentRecord]:
        return self._journal.incidents(open_only=open_only)

    def incident(self, incident: str) -> IncidentRecord:
        return self._journal.incident(incident)

    def history(self) -> list[tuple[StoredEvent, Decision | None]]:
        return self._journal.history()

    def get_meta(self, key: str) -> str | None:
        return self._journal.get_meta(key)

    def events_by_id(self, ids: Sequence[str]) -> list[StoredEvent]:
        """The stored events among ``ids``: the journal's own lookup where it has one (an
        incident's page asks for them), else read from its history."""
        lookup = getattr(self._journal, "events_by_id", None)
        if callable(lookup):
            found: list[StoredEvent] = lookup(ids)
            return found
        wanted = set(ids)
        return [s for s, _ in self._journal.history() if s.event.id in wanted]

    @contextmanager
    def _timed(self, write: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._metrics.commit_seconds.labels(write).observe(time.perf_counter() - start)

    # --- the writes ----------------------------------------------------------------------

    def append_events(self, events: Sequence[HealthEvent], received: Stamp) -> list[bool]:
        with self._timed("events"):
            return self._journal.append_events(events, received)

    def record_decision(self, decision: Decision, at: Stamp) -> list[ActionRecord]:
        with self._timed("decision"):
            records = self._journal.record_decision(decision, at)
        self._metrics.decisions.labels(str(decision.verdict), decision.fault).inc()
        with self._lock:
            if decision.opens and decision.incident:
                self._opened[decision.incident] = at.mono
            for r in records:
                self._planned[r.id] = (r.action.kind, at.mono)
        return records

    def record_outcome(
        self,
        action_id: int,
        status: ActionStatus,
        at: Stamp,
        *,
        detail: str = "",
        attempts: int = 1,
    ) -> None:
        kind, planned = self._action(action_id)  # read first: a done one is pending no more
        with self._timed("outcome"):
            self._journal.record_outcome(action_id, status, at, detail=detail, attempts=attempts)
        self._metrics.actions.labels(kind, str(status)).inc()
        if status in _ENDED:
            if planned is not None:
                self._metrics.action_seconds.labels(kind).observe(max(0.0, at.mono - planned))
            with self._lock:
                self._planned.pop(action_id, None)

    def add_phase(self, incident: str, phase: Phase) -> bool:
        with self._timed("phase"):
            added = self._journal.add_phase(incident, phase)
        if added:
            opened = self._opened_at(incident)
            if opened is not None:
                self._metrics.phase_seconds.labels(str(phase.name)).observe(
                    max(0.0, phase.at.mono - opened)
                )
        return added

    def update_incident(
        self,
        incident: str,
        *,
        jobs: Sequence[str] | None = None,
        info: IncidentInfo | None = None,
    ) -> None:
        with self._timed("incident"):
            self._journal.update_incident(incident, jobs=jobs, info=info)

    def close_incident(self, incident: str, at: Stamp, detail: str = "") -> bool:
        with self._timed("incident"):
            closed = self._journal.close_incident(incident, at, detail)
        if closed:
            self._metrics.incidents_closed.inc()
            with self._lock:
                self._opened.pop(incident, None)
        return closed

    def set_meta(self, key: str, value: str) -> None:
        with self._timed("meta"):
            self._journal.set_meta(key, value)

    # --- what a write needs to know ------------------------------------------------------

    def _action(self, action_id: int) -> tuple[str, float | None]:
        """The action's kind and when it was planned (monotonic; None for one planned
        before this process started: its planning stamp's clock may be another boot's)."""
        with self._lock:
            known = self._planned.get(action_id)
        if known is not None:
            return known
        for r in self._journal.pending_actions() + self._journal.held_actions():
            if r.id == action_id:
                return r.action.kind, None
        return "unknown", None

    def _opened_at(self, incident: str) -> float | None:
        with self._lock:
            opened = self._opened.get(incident)
        if opened is not None:
            return opened
        try:
            record = self._journal.incident(incident)
        except Exception:  # an unknown incident: the journal refused the phase already
            return None
        with self._lock:
            self._opened[incident] = record.opened.mono
        return record.opened.mono


class StateCollector(Collector):
    """What the coordinator has now, read at each scrape: open incidents by fault, ready
    spares, whether the breaker holds anything, and which nodes' agents went silent."""

    def __init__(
        self,
        open_incidents: Callable[[], Sequence[Any]],
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self._open = open_incidents
        self._status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_fault = GaugeMetricFamily(
            "recover_open_incidents_by_fault",
            "Incidents not yet closed, by fault",
            labels=["fault"],
        )
        counts: dict[str, int] = {}
        for incident in self._open():
            counts[incident.fault] = counts.get(incident.fault, 0) + 1
        for fault, n in sorted(counts.items()):
            by_fault.add_metric([fault], n)
        yield by_fault
        try:
            status = self._status()
        except NotLeader:
            # A standby knows no spares or breaker of its own; were it to say 0 spares, an
            # alert summing the replicas would fire. Only the leader exports these.
            return
        yield GaugeMetricFamily(
            "recover_spares_ready", "Spares in the pool ready to be promoted",
            value=len(status.get("spares", [])),
        )  # fmt: skip
        breaker = status.get("breaker", {})
        yield GaugeMetricFamily(
            "recover_breaker_tripped", "1 while the breaker holds take-outs, else 0",
            value=1 if breaker.get("tripped") else 0,
        )  # fmt: skip
        silent = GaugeMetricFamily(
            "recover_agent_silent",
            "1 for a node whose agent's heartbeats stopped (a suspect), else 0",
            labels=["node"],
        )
        for row in status.get("nodes", []):
            silent.add_metric([row["name"]], 1 if row.get("suspect") else 0)
        yield silent


class LeaderCollector(Collector):
    """Whether this replica leads, and the lease's term as it last saw it (a coordinator that
    is one replica of several)."""

    def __init__(self, role: Callable[[], Role]) -> None:
        self._role = role

    def collect(self) -> Iterator[GaugeMetricFamily]:
        r = self._role()
        yield GaugeMetricFamily(
            "recover_leader", "1 while this coordinator replica leads (acts), 0 standing by",
            value=1 if r.role == "leader" else 0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "recover_leader_term", "The leader lease's term (transitions) as this replica saw it",
            value=r.term,
        )  # fmt: skip
