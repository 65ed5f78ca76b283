"""The incident journal as a port: the coordinator's durable memory.

Everything the coordinator learns or does is written here before it is acknowledged or acted
on: events (the moment they arrive, group-committed), decisions (with the incident they open or
join and the actions they plan, in one transaction), each action's outcome, and the phases of
every incident with both clocks. A coordinator killed at any point restarts from this alone:
undecided events are decided, planned actions are applied (idempotently), open incidents are
reconciled with Slurm.

The embedded implementation is SQLite (``service.journaldb.journal.SqliteJournal``); tests of
pure logic may use an in-memory fake of this port.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypedDict, cast

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


class PhaseName(StrEnum):
    """Every phase an incident can reach: the journal's vocabulary, written by the engine, the
    executor, the Kubernetes steps and the journal itself, read by the report, the scenario
    expectations and the scenario watcher. Stored as the value (``node-down``)."""

    fault = "fault"
    """The agent observed the fault (its ``observed_at``, on the receipt's monotonic clock)."""
    received = "received"
    """The event that opened the incident was committed."""
    decided = "decided"
    """Its decision was committed (written by the journal with the decision)."""
    held = "held"
    """The breaker held the take-out (detail: why)."""
    released = "released"
    """``recover breaker reset`` released the held actions."""
    node_down = "node-down"
    node_drained = "node-drained"
    jobs_signalled = "jobs-signalled"
    """USR1 sent for checkpoint-then-requeue (detail: the job ids)."""
    jobs_saved = "jobs-saved"
    """The signalled jobs left the node: saved and requeued, or (the detail names them) ended
    without a save, which the coordinator then requeues (``job-ended``)."""
    save_timeout = "save-timeout"
    """The save deadline passed; what was left was requeued without a save."""
    jobs_requeued = "jobs-requeued"
    """A job of the incident was requeued: by Slurm (its restart count rose, or it is pending
    again) or by the coordinator (detail says which, and how the job had ended)."""
    job_ended = "job-ended"
    """A job that ran on the node ended abnormally (FAILED, NODE_FAIL, BOOT_FAIL) around the
    fault, and Slurm did not requeue it (detail: id, how it ended, when)."""
    requeue_refused = "requeue-refused"
    """A job that ended around the fault is not requeued (detail: id and why: the
    do-not-restart exit status, ``--no-requeue``, the restart budget, dry run)."""
    no_spare = "no-spare"
    """The spare pool was empty when the promotion ran; it waits for a spare."""
    spare_checking = "spare-checking"
    """The chosen spare had no fresh passing check (policy ``validation.required``): one was
    asked for, and the promotion waits on it (detail starts with the spare's name)."""
    spare_checked = "spare-checked"
    """The spare the promotion waited on passed its check (detail: its name, the time the
    check took)."""
    spare_rejected = "spare-rejected"
    """The spare the promotion waited on failed its check: it is held out with the failed
    check as its reason and the next spare is tried (detail: its name and the check's
    words)."""
    spare_promoted = "spare-promoted"
    """The spare is in service (detail: exactly its name)."""
    job_running = "job-running"
    """Every job of the incident runs again after a restart (detail: ``id@nodes``)."""
    in_allocation = "in-allocation"
    """A job of the incident kept running without the node, never requeued: it holds spares
    of its own (``recover sbatch --spares``, ``--no-kill``), Slurm dropped the node from it and
    its supervisor relaunches training on a spare inside the allocation (detail:
    ``id@nodes`` it holds now)."""
    left_to_job = "left-to-job"
    """A hang of a job that recovers inside its allocation was left to the job's supervisor,
    which watches the same progress records, ends the hung launch and relaunches it; the
    coordinator does not requeue it (detail: the job ids). See
    :mod:`recovery.contract.jobmark`."""
    returned_to_pool = "returned-to-pool"
    """A repaired node went back into the spare pool (detail starts with its name)."""
    job_released = "job-released"
    """A job Slurm held (``job-held``) was released by the coordinator, to continue from its
    checkpoint (detail: the job and why)."""
    back_in_service = "back-in-service"
    """The node this incident took out is in service again without the toolkit (an
    operator resumed it, or the cluster started anew): the incident no longer holds it out,
    and a new fault there is acted on (detail: what Slurm shows)."""
    closed = "closed"
    k8s_marked = "k8s-marked"
    """Kubernetes: the node cordoned, tainted and conditioned."""
    slurmd_pod_deleted = "slurmd-pod-deleted"
    slurmd_pod_kept = "slurmd-pod-kept"
    k8s_spare_promoted = "k8s-spare-promoted"
    k8s_skipped = "k8s-skipped"
    """Kubernetes does not know the node: its Kubernetes steps end."""
    k8s_failed = "k8s-failed"
    """The API server refused a step (a verdict): the Kubernetes steps end."""
    k8s_cleared = "k8s-cleared"
    k8s_spare_retired = "k8s-spare-retired"
    operator_drain_requested = "operator-drain-requested"
    """Slinky: the drain was asked of the slurm-operator (its pod annotation)."""


@dataclass(frozen=True)
class Phase:
    """A named point in an incident's life. ``name`` is a :class:`PhaseName`; a plain string
    (as read back) is converted, and one that names no phase raises ValueError."""

    name: PhaseName
    at: Stamp
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", PhaseName(self.name))


class JobPath(StrEnum):
    """How an incident treats the node's jobs (``IncidentInfo.path``)."""

    save_then_requeue = "save-then-requeue"
    """Saved first (the node still works), then requeued."""
    down_requeue = "down-requeue (no save: the node cannot run the job)"
    """Down at once (the GPU is gone: nothing could save); Slurm requeues them."""
    requeue = "requeue (node kept)"
    released = "released (Slurm held the job)"
    """A job Slurm held with no node fault to blame, released by the coordinator."""
    none = "none"


class RequeueOutcome(StrEnum):
    """Where the coordinator's requeue of one ended job stands (``RequeueNote.outcome``)."""

    noted = "noted"
    """Decided and noted before the request: a restarted coordinator finds it and asks again
    (a no-op when the request had landed, since the job's restart count rose)."""
    requeued = "requeued"
    """The job is requeued (by this request, or it had been already)."""
    refused = "refused"
    """Not requeued: the policy said no, or Slurm refused (``detail`` says why)."""
    skipped = "skipped"
    """Dry run: it would have been requeued."""


class RequeueNote(TypedDict):
    """One job that ended around an incident's fault and what the coordinator did about it."""

    restart_count: int
    """The run that ended (the job's restart count then): the one requeued at most once."""
    ended: str
    """How and when it ended (``FAILED exit 134 at 1796214872``)."""
    outcome: RequeueOutcome
    detail: str
    at: float
    """Wall time of the note (Unix seconds): what the restart budget's window counts."""


class SaveNote(TypedDict):
    """What checkpoint-then-requeue noted before signalling: the jobs it signalled and when
    (monotonic seconds), so that a restarted coordinator never signals twice."""

    jobs: list[str]
    signalled_mono: float
    deadline_mono: float


class SpareCheckNote(TypedDict):
    """One check of a spare a promotion waited on: the spare, its verdict (``passed``,
    ``failed: <check>``), how long it took, when it ended (wall seconds), and the failed
    check's words."""

    spare: str
    verdict: str
    took_s: float
    at: float
    detail: str


class IncidentInfo(TypedDict, total=False):
    """An incident's facts (stored as one JSON object; every key is optional). Journals may
    hold keys an older or newer version wrote; they are kept as they are."""

    job_restarts: dict[str, int]
    """Each job's restart count when the incident opened (a higher one means requeued)."""
    path: JobPath
    save: SaveNote
    spare: str | None
    """The spare being promoted in the node's place, noted just before it is resumed: a
    restarted coordinator finds it and finishes that promotion instead of taking a second
    spare. Set back to None when it stopped being a ready spare before its promotion."""
    requeues: dict[str, RequeueNote]
    """Jobs that ended abnormally around the fault, by id, with what became of each: noted
    before each requeue request, so that a restart never requeues one run twice."""
    supervised: list[str]
    """Jobs left to their own supervisor (``left-to-job``): not requeued, followed as
    recovering inside their allocation."""
    spare_rechosen: str
    """The spare the policy chose again when the decision's choice
    (:attr:`recovery.model.PromoteSpare.spare`) was gone, or the pool was empty when it
    decided; it replaces the decision's choice."""
    spare_checks: list[SpareCheckNote]
    """Every check of a spare the promotion waited on (policy ``validation.required``),
    oldest first."""


def incident_info(stored: Mapping[str, Any]) -> IncidentInfo:
    """An incident's facts as read back (its JSON object), as :class:`IncidentInfo`; keys
    another version wrote are kept."""
    return cast(IncidentInfo, dict(stored))


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
    info: IncidentInfo = field(default_factory=lambda: IncidentInfo())
    """Facts worth keeping: the jobs' restart counts, the path taken, the save, the spare."""


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
        info: IncidentInfo | None = None,
    ) -> None:
        """Set the incident's job list and/or merge ``info`` into its facts (key by key)."""
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
