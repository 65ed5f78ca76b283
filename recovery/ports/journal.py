"""The incident journal as a port: the coordinator's durable memory.

Everything the coordinator learns or does is written here before it is acknowledged or acted
on: events (the moment they arrive, group-committed), decisions (with the incident they open or
join and the actions they plan, in one transaction), each action's outcome, and the phases of
every incident with both clocks. A coordinator killed at any point restarts from this alone:
undecided events are decided, planned actions are applied (idempotently), open incidents are
reconciled with Slurm.

The embedded implementation is SQLite (``recovery.journaldb.journal.SqliteJournal``); tests of
pure logic may use an in-memory fake of this port.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from recovery.model import Action, Decision, HealthEvent
from recovery.ports.clock import Stamp


class ActionStatus(StrEnum):
    """Where one planned action stands."""

    planned = "planned"
    """Decided, not yet applied (or applied, but its outcome was not yet recorded)."""
    held = "held"
    """Stopped by the breaker; waits for ``recover breaker reset`` or expires."""
    done = "done"
    """Took effect (or already held: the port returned False)."""
    waiting = "waiting"
    """Cannot complete yet (no spare in the pool); retried when things change."""
    failed = "failed"
    """A verdict from the other side (refused), or transient errors past every retry."""
    expired = "expired"
    """Held longer than the configured age; dropped instead of replayed."""
    skipped = "skipped"
    """Not applied on purpose (dry run, superseded)."""


class IncidentStatus(StrEnum):
    open = "open"
    closed = "closed"


@dataclass(frozen=True)
class StoredEvent:
    """An event as the journal holds it: ``seq`` orders arrivals (1, 2, ...)."""

    seq: int
    event: HealthEvent
    received: Stamp
    decided: bool


@dataclass(frozen=True)
class ActionRecord:
    """One planned action and what became of it. ``id`` is unique in the journal."""

    id: int
    incident: str
    action: Action
    status: ActionStatus
    attempts: int = 0
    detail: str = ""
    planned: Stamp | None = None
    finished: Stamp | None = None


@dataclass(frozen=True)
class Phase:
    """A named point in an incident's life (``detected``, ``decided``, ``node-down``,
    ``jobs-requeued``, ``spare-promoted``, ``job-running``, ``closed``, ...)."""

    name: str
    at: Stamp
    detail: str = ""


@dataclass(frozen=True)
class IncidentRecord:
    """An incident: one fault on one node and everything done about it."""

    id: str
    node: str
    fault: str
    verdict: str
    status: IncidentStatus
    opened: Stamp
    closed: Stamp | None = None
    event_ids: tuple[str, ...] = ()
    phases: tuple[Phase, ...] = ()
    actions: tuple[ActionRecord, ...] = ()
    jobs: tuple[str, ...] = ()
    """Slurm job ids that ran on the node when the incident opened."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form facts worth keeping (path taken, spare chosen, held reason, count)."""


class Journal(Protocol):
    """Durable record of events, decisions, actions and incidents.

    Every write method is durable when it returns (committed, synced). Failure mode:
    :class:`recovery.errors.JournalError` when the store cannot be written or read.
    """

    def append_events(self, events: Sequence[HealthEvent], received: Stamp) -> list[bool]:
        """Commit ``events`` in one transaction (group commit); True for each one that was
        new, False for a duplicate id (ignored; the first copy stays)."""
        ...

    def undecided(self) -> list[StoredEvent]:
        """Events committed but not yet decided, in arrival order."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """The calling thread's writes inside the ``with`` block commit together, durable on
        exit (one sync instead of one per write); each write stays atomic by itself. Act on
        nothing written inside before the block exits."""
        ...

    def record_decision(self, decision: Decision, at: Stamp) -> list[ActionRecord]:
        """In one transaction: store ``decision``, mark its event decided, open or join its
        incident (phase ``decided``), and plan its actions (status ``held`` when the decision
        is held, else ``planned``). Returns the planned action records."""
        ...

    def record_outcome(
        self,
        action_id: int,
        status: ActionStatus,
        at: Stamp,
        *,
        detail: str = "",
        attempts: int = 1,
    ) -> None:
        """Record what became of one action."""
        ...

    def pending_actions(self) -> list[ActionRecord]:
        """Actions ``planned`` or ``waiting``, in the order they were planned."""
        ...

    def held_actions(self) -> list[ActionRecord]:
        """Actions the breaker holds, oldest first."""
        ...

    def add_phase(self, incident: str, phase: Phase) -> bool:
        """Record a phase of ``incident``; False when that phase name was already recorded
        (the first instant is kept)."""
        ...

    def update_incident(
        self,
        incident: str,
        *,
        jobs: Sequence[str] | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        """Set the incident's job list and/or merge ``info`` into its facts."""
        ...

    def close_incident(self, incident: str, at: Stamp, detail: str = "") -> bool:
        """Close ``incident`` (phase ``closed``); False when it was closed already."""
        ...

    def incidents(self, *, open_only: bool = False) -> list[IncidentRecord]:
        """Incidents, oldest first, with their phases and actions."""
        ...

    def incident(self, incident: str) -> IncidentRecord:
        """One incident; an unknown id raises UsageError naming how to list them."""
        ...

    def history(self) -> list[tuple[StoredEvent, Decision | None]]:
        """Every event in arrival order with its decision (None if undecided): what policy
        replay and the rebuilding of policy state read."""
        ...

    def get_meta(self, key: str) -> str | None:
        """A small named value (breaker reset time, schema notes); None when unset."""
        ...

    def set_meta(self, key: str, value: str) -> None:
        """Set a small named value."""
        ...
