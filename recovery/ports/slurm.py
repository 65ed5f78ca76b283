"""The one small port through which the rest of the toolkit talks to Slurm.

``SlurmControl`` is named for its use: read node and job state, take nodes out of service with
a reason that marks the change as ours, put them back (only when the mark is ours), requeue,
submit and cancel jobs. :class:`slurm.cli_slurm.CliSlurm` implements it with Slurm's command line
tools and :class:`slurm.rest_slurm.RestSlurm` over slurmrestd (which, on Slurm 22.05, cannot
change nodes or requeue: those raise :class:`recovery.errors.SlurmUnsupportedError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from recovery.errors import UsageError

#: Every reason this toolkit writes starts with this; only reasons carrying it are ours.
OWNER_PREFIX = "recover:"

#: Slurm node names we accept: a letter, then letters, digits, ``-``, ``_`` or ``.``.
NODE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
#: Slurm job ids: a positive integer, optionally with an array or het-job suffix.
JOB_ID_RE = re.compile(r"^[1-9][0-9]{0,9}(?:_[0-9]{1,9}|\+[0-9]{1,4})?$")

# Base states a node can be in (Slurm's NODE_STATE_BASE); everything else is a flag.
NODE_BASE_STATES = frozenset(
    {"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "END"}
)


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a well-formed Slurm node name.

    Raises :class:`UsageError` naming the accepted form otherwise. Whether the node exists is
    checked separately against the cluster.
    """
    if not NODE_NAME_RE.fullmatch(name):
        raise UsageError(
            f"Invalid node name {name!r}: expected a letter followed by up to 62 letters, "
            "digits, '-', '_' or '.' (e.g. node1)"
        )
    return name


def validate_job_id(job_id: str | int) -> str:
    """Return ``job_id`` as text if it is a well-formed Slurm job id (e.g. ``42``, ``42_3``).

    Raises :class:`UsageError` otherwise.
    """
    text = str(job_id)
    if not JOB_ID_RE.fullmatch(text):
        raise UsageError(
            f"Invalid job id {text!r}: expected a positive integer such as 42 (array tasks as 42_3)"
        )
    return text


def is_ours(reason: str) -> bool:
    """True when ``reason`` was written by this toolkit (it starts with :data:`OWNER_PREFIX`).

    The one ownership predicate: every "may we undo this" question goes through it. An empty
    reason is not ours (we always write one); see :func:`is_slurms_own` and
    :attr:`NodeInfo.held_by_other` for what it means otherwise.
    """
    return reason.strip().startswith(OWNER_PREFIX)


#: The name this predicate had first; the same function.
ours = is_ours

#: Reasons slurmctld writes by itself and undoes by itself: "Not responding" is its mark on a
#: node whose slurmd went silent (DOWN+NOT_RESPONDING, set by SlurmUser), cleared when slurmd
#: registers again (ReturnToService=1). Its other reasons ("Kill task failed", "Low
#: RealMemory", ...) ask for a person's attention and count as someone else's.
SLURM_OWN_REASONS = frozenset({"Not responding"})


def is_slurms_own(reason: str) -> bool:
    """True when ``reason`` is empty or in :data:`SLURM_OWN_REASONS`: Slurm's own doing, not
    another owner's mark. Writing ours over it only keeps the node out longer (safe); once
    ours is there, we may undo it."""
    text = reason.strip()
    return not text or text in SLURM_OWN_REASONS


def mark(reason: str) -> str:
    """Prefix ``reason`` with :data:`OWNER_PREFIX` unless it already carries it.

    Raises :class:`UsageError` for an empty reason or one with a newline or a double quote,
    which Slurm would store mangled.
    """
    text = reason.strip()
    if is_ours(text):
        text = text[len(OWNER_PREFIX) :].strip()
    if not text or "\n" in text or '"' in text:
        raise UsageError(f"Invalid reason {reason!r}: one non-empty line without '\"'")
    return f"{OWNER_PREFIX} {text}"


@dataclass(frozen=True)
class NodeInfo:
    """One node as slurmctld sees it.

    ``state`` is the base state (IDLE, ALLOCATED, MIXED, DOWN, ...); ``flags`` are the rest
    (DRAIN, NOT_RESPONDING, COMPLETING, ...). ``reason`` is empty when none is set;
    ``reason_set_by`` is the user who set it (empty when unknown).
    """

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    reason_set_by: str = ""
    cpus: int = 0
    partitions: tuple[str, ...] = ()
    features: frozenset[str] = frozenset()
    """Slurm node features (``Features=``), e.g. a rack or NVLink domain name."""
    reason_changed_at: float = 0.0
    """When the reason was set (Unix seconds); 0 when unknown or no reason."""

    @property
    def down(self) -> bool:
        """The node is DOWN (by an admin, or because slurmd stopped answering)."""
        return self.state == "DOWN"

    @property
    def drained(self) -> bool:
        """The node carries the DRAIN flag (draining or drained)."""
        return "DRAIN" in self.flags

    @property
    def in_service(self) -> bool:
        """The node may receive new jobs: not DOWN, not draining, slurmd answering."""
        return not (self.down or self.drained or "NOT_RESPONDING" in self.flags)

    @property
    def out_of_service(self) -> bool:
        """The node is DOWN or carries DRAIN: someone (we, an admin, Slurm) took it out."""
        return self.down or self.drained

    @property
    def reason_is_ours(self) -> bool:
        """The current reason carries our owner prefix (:func:`is_ours`)."""
        return is_ours(self.reason)

    @property
    def held_by_other(self) -> bool:
        """Held out of service by someone else: DOWN or DRAIN with a reason that is neither
        ours nor Slurm's own (:func:`is_slurms_own`). We never undo such a node and never
        overwrite its reason.

        Slurm's own mark is not another owner's: we may write ours over it (the node then
        stays out until we undo ours) and once ours is there we may undo it.
        """
        return self.out_of_service and not self.reason_is_ours and not is_slurms_own(self.reason)


def describe_state(node: NodeInfo | None) -> str:
    """``node``'s state and flags as one word, e.g. ``IDLE+DRAIN+NOT_RESPONDING`` (flags
    sorted); ``missing`` for None. Used wherever a node's state is shown to a person."""
    if node is None:
        return "missing"
    return "+".join([node.state, *sorted(node.flags)])


@dataclass(frozen=True)
class JobInfo:
    """One job as slurmctld sees it (running, pending, or finished within ``MinJobAge``,
    300 s by default: slurmctld forgets a finished job after that, and without an accounting
    daemon nothing else remembers it).

    ``state`` is Slurm's base job state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...);
    ``nodes`` are the nodes it runs on, or for a finished job the nodes it ran on, expanded
    (a pending job lists none); ``restart_count`` counts requeues (0 on the first run).
    """

    job_id: str
    name: str
    state: str
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    reason: str = ""
    exit_code: int | None = None
    """The batch script's exit status (0-255) of its last run, as ``ExitCode=N:0`` shows it;
    0 when a signal ended it; None when unknown. A pending job that ran before keeps the
    status of that run (read it only once the job :attr:`finished`)."""
    flags: frozenset[str] = frozenset()
    signal: int | None = None
    """The signal that ended the batch script (``ExitCode=0:N``, e.g. 9); None when it
    exited by itself, or unknown."""
    end_time: float = 0.0
    """When the job ended (Unix seconds) once it :attr:`finished`; 0 while it has not (Slurm's
    own value for a live job is a projection, not kept here) or when unknown."""
    requeueable: bool = True
    """The job may be requeued (``--requeue``, or the cluster's ``JobRequeue=1`` default);
    Slurm refuses to requeue one submitted with ``--no-requeue``."""
    batch_host: str = ""
    """The node that runs (or ran) the job's batch script; "" when unknown or not started."""
    comment: str = ""
    """Slurm's comment field (``--comment``): ``recover sbatch`` marks its jobs there
    (:mod:`recovery.contract.jobmark`)."""

    @property
    def finished(self) -> bool:
        """The job reached a terminal state and will not run again unless requeued."""
        return self.state in TERMINAL_JOB_STATES

    @property
    def active(self) -> bool:
        """The job has not ended: pending, starting, running, suspended or completing (any
        state but a terminal one). The one test of "this job still lives": the jobs of a
        failed node an incident follows, and whether a cancel has anything to end."""
        return not self.finished

    @property
    def requeue_held(self) -> bool:
        """Slurm requeued the job in held state and nobody released it yet: ``REQUEUE_HOLD``
        with a hold reason (``JobHeldUser``, ``JobHeldAdmin``). Slurm 25.11 holds an
        expedited job whose script failed while no Epilog failed. A released job keeps
        showing ``REQUEUE_HOLD`` until it starts, with its reason gone."""
        return self.state == "REQUEUE_HOLD" and self.reason.startswith("JobHeld")

    def held_after(self, restart_count: int) -> bool:
        """Its run ``restart_count`` ended and Slurm requeued it itself, held
        (:attr:`requeue_held` at ``restart_count + 1``)."""
        return self.requeue_held and self.restart_count == restart_count + 1

    def uses(self, node: str) -> bool:
        """The job holds ``node`` now: running, suspended or completing there. What "the jobs
        on a node" means everywhere (``SlurmControl.jobs_on``, the fakes): a pending job holds
        no node, and a finished one has let go of it."""
        return node in self.nodes and self.state in ON_NODE_JOB_STATES


#: Job states in which a job holds the nodes it was given (:meth:`JobInfo.uses`).
ON_NODE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})

TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)


@dataclass(frozen=True)
class BatchJob:
    """A batch job to submit: a script plus sbatch options (without the leading ``--``).

    ``options`` maps an sbatch long option to its value (``None`` for a bare switch such as
    ``requeue``); ``extra_args`` are passed through verbatim before the script.
    """

    script: str
    options: Mapping[str, str | None] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    workdir: str | None = None


class SlurmControl(Protocol):
    """What the toolkit needs from Slurm. Every action is idempotent and marked as ours.

    Ownership: we undo only our own marks (:func:`is_ours`) and never overwrite the reason of
    a node :attr:`NodeInfo.held_by_other`. Races with Slurm itself: an action Slurm refuses
    re-reads the node or job and returns False when the state it wanted already holds (a
    slurmd registering again, a job ending in between); any other refusal is raised.

    Failure modes shared by all methods: :class:`recovery.errors.SlurmUnavailableError`
    (transient: slurmctld unreachable or timed out),
    :class:`recovery.errors.SlurmRefusedError` (a verdict: Slurm refused the request) and
    :class:`recovery.errors.SlurmUnsupportedError` (a verdict: this backend cannot ask it of
    this Slurm).
    Unknown node names raise :class:`recovery.errors.UsageError` naming the known nodes.
    """

    def nodes(self) -> list[NodeInfo]:
        """All nodes, sorted by name."""
        ...

    def node(self, name: str) -> NodeInfo:
        """One node; an unknown name raises UsageError listing the known ones."""
        ...

    def jobs(self) -> list[JobInfo]:
        """All jobs slurmctld still remembers (running, pending, recently finished)."""
        ...

    def job(self, job_id: str | int) -> JobInfo:
        """One job; an unknown id raises UsageError."""
        ...

    def jobs_on(self, node: str) -> list[JobInfo]:
        """Running (or completing) jobs that use ``node``."""
        ...

    def down(self, node: str, reason: str) -> bool:
        """Set ``node`` DOWN with ``reason`` (prefixed with ``recover:``); requeueable jobs on
        it are requeued by Slurm. Returns False when it already held (no-op)."""
        ...

    def drain(self, node: str, reason: str) -> bool:
        """Set ``node`` DRAIN with ``reason`` (prefixed); running jobs keep running.
        Returns False when it already held (no-op)."""
        ...

    def resume(self, node: str, *, force: bool = False) -> bool:
        """Return ``node`` to service. Only if its reason is ours unless ``force``; otherwise
        raises ReasonNotOursError. Returns False when it was already in service."""
        ...

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        """Set every node in ``nodes`` DOWN with ``reason`` in one Slurm call (a hostlist), with
        the same per-node rules as :meth:`down`. Returns the nodes that changed, sorted."""
        ...

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        """:meth:`drain` for several nodes in one Slurm call; returns the nodes that changed."""
        ...

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        """Send ``signal`` (e.g. ``USR1``) to a running job: the CLI backend reaches the batch
        shell only (``scancel --signal=SIG --batch``), which the sbatch wrapper forwards to
        training; slurmrestd signals the whole job. False (no-op) when the job is not
        running."""
        ...

    def requeue(self, job_id: str | int) -> bool:
        """Requeue a job. Returns False when it is already pending (no-op)."""
        ...

    def requeue_ended(self, job_id: str | int, restart_count: int) -> bool:
        """Requeue a job that ended (FAILED, NODE_FAIL, ...) while it still is the run
        numbered ``restart_count`` that ended: the state is read just before the request.
        Returns False (no-op) when it is not: it runs or waits again (requeued meanwhile by
        Slurm, its wrapper, an operator or an earlier call of ours; its restart count rose),
        or it is still live. So a second call for the same run never requeues it twice.
        A run Slurm requeued in held state (``REQUEUE_HOLD`` at ``restart_count + 1``: Slurm
        25.11's expedited requeue when no Epilog failed) is released instead (True).
        An unknown job (slurmctld forgot it) raises UsageError; a job Slurm will not requeue
        (``--no-requeue``) raises SlurmRefusedError."""
        ...

    def submit(self, job: BatchJob) -> str:
        """Submit a batch job; returns its job id."""
        ...

    def cancel(self, job_id: str | int) -> bool:
        """Cancel a job. Returns False when it had already finished (no-op)."""
        ...
