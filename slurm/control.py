"""``SlurmBase``: what every :class:`recovery.ports.slurm.SlurmControl` backend does the same way.

Validation, idempotence, ownership and the races with Slurm itself live here, once; a backend
(``slurm.cli_slurm`` over the command line tools, ``slurm.rest_slurm`` over slurmrestd) supplies
only the reads and the raw requests. Each raw request raises SlurmRefusedError when Slurm says
no and SlurmUnavailableError when it cannot be reached; the decisions around it (is there
anything to do, did Slurm get there first) are made here from fresh reads, so both backends
give the same answers to the same contract tests.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from recovery.errors import (
    ReasonNotOursError,
    SlurmRefusedError,
    SlurmUnsupportedError,
    UsageError,
    unknown_choice,
)
from recovery.ports.slurm import (
    BatchJob,
    JobInfo,
    NodeInfo,
    mark,
    validate_job_id,
    validate_node_name,
)

# slurmctld's answer to a requeue of a job whose requeue is under way (it is COMPLETING on its
# old node): the requeue we asked for already holds.
_ALREADY_REQUEUED = re.compile(r"Job is pending execution", re.IGNORECASE)
_SIGNAL_RE = re.compile(r"[A-Z0-9]{2,8}")


def take_out_reason(info: NodeInfo, state: str, text: str) -> str | None:
    """The reason to write when taking ``info`` out with ``state`` (DOWN or DRAIN) and our
    marked reason ``text``; None when there is nothing to do. Pure.

    A node held by someone else (:attr:`NodeInfo.held_by_other`) keeps their reason: DOWN
    already, or asked to DRAIN, is a no-op; drained by them and asked DOWN, it goes DOWN with
    their reason, so our resume (which only undoes our marks) never puts it back. A node
    already in ``state`` with ``text`` is a no-op; anything else (in service, ours with
    another reason, or out with Slurm's own mark, :func:`is_slurms_own`) gets ``text``.
    """
    if info.held_by_other:
        return None if info.down or state == "DRAIN" else info.reason
    held = info.down if state == "DOWN" else info.drained
    return None if held and info.reason == text else text


def take_out_plan(nodes: Iterable[NodeInfo], state: str, text: str) -> dict[str, list[str]]:
    """The requests one DOWN or DRAIN of ``nodes`` with our marked reason ``text`` needs:
    reason to write -> the names to write it on (sorted, each once), one request per reason.
    Nodes :func:`take_out_reason` leaves alone are in none; an empty plan is a no-op. Pure."""
    plan: dict[str, list[str]] = {}
    for info in sorted({n.name: n for n in nodes}.values(), key=lambda n: n.name):
        why = take_out_reason(info, state, text)
        if why is not None:
            plan.setdefault(why, []).append(info.name)
    return plan


def resume_needed(info: NodeInfo, *, force: bool = False) -> bool:
    """Whether returning ``info`` to service needs a request: False (a no-op) when it is in
    service already; True when it is out and the mark on it is ours (or ``force``). Raises
    ReasonNotOursError naming the reason and who set it otherwise: we put back only what we
    took out, and an empty reason is not ours either. Pure."""
    if not info.out_of_service:
        return False
    if not info.reason_is_ours and not force:
        raise ReasonNotOursError(info.name, info.reason, info.reason_set_by)
    return True


def requeue_needed(job: JobInfo) -> bool:
    """Whether a requeue of ``job`` needs a request: False (a no-op) when it is pending
    already. Pure."""
    return job.state != "PENDING"


def requeue_ended_needed(job: JobInfo, restart_count: int) -> bool:
    """Whether requeueing the ended run ``restart_count`` of ``job`` needs a request: True
    only while the job is finished at that restart count. Once anyone requeued it the count
    is higher (Slurm raises it at the requeue itself), and a live job is not an ended one:
    both are no-ops. Pure."""
    return job.finished and job.restart_count == restart_count


def release_held_needed(job: JobInfo, restart_count: int) -> bool:
    """Whether the ended run ``restart_count`` of ``job`` waits in Slurm's hold: Slurm 25.11
    requeued it itself (expedited, its count one higher) but held it (``REQUEUE_HOLD``), as
    it does when no Epilog failed. Releasing it is that run's requeue; once released (or
    run again) it is not held, so a second call is a no-op. Pure."""
    return job.held_after(restart_count)


class SlurmBase(ABC):
    """The SlurmControl contract (see the Protocol) over a backend's reads and raw requests.

    Subclasses implement :meth:`nodes`, :meth:`jobs`, :meth:`submit` and the ``_request_*``
    methods; a raw request is sent only once the state read just before says it is needed,
    and a refused one is judged by a second read (never retried blindly).
    """

    #: Port methods this backend cannot perform against its Slurm: they raise
    #: SlurmUnsupportedError whenever they would change something (a no-op still answers).
    unsupported: frozenset[str] = frozenset()

    # --- what a backend supplies -----------------------------------------------------------

    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """All nodes, sorted by name."""

    @abstractmethod
    def jobs(self) -> list[JobInfo]:
        """All jobs slurmctld remembers (pending, running, finished within MinJobAge)."""

    @abstractmethod
    def submit(self, job: BatchJob) -> str:
        """Submit a batch job; returns its job id."""

    @abstractmethod
    def _request_update(self, nodes: Sequence[str], state: str, reason: str) -> None:
        """Set every node in ``nodes`` to ``state`` (DOWN or DRAIN) with ``reason``, in one
        request."""

    @abstractmethod
    def _request_resume(self, node: str) -> None:
        """Return ``node`` to service."""

    @abstractmethod
    def _request_signal(self, job_id: str, signal: str) -> None:
        """Send ``signal`` (a name such as USR1) to a running job."""

    @abstractmethod
    def _request_requeue(self, job_id: str) -> None:
        """Requeue a job."""

    @abstractmethod
    def _request_cancel(self, job_id: str) -> None:
        """Cancel a job."""

    def _request_release(self, job_id: str) -> None:
        """Release a held job (only asked of a job in ``REQUEUE_HOLD``, which only Slurm
        25.11's expedited requeue makes)."""
        raise SlurmUnsupportedError(f"release of job {job_id}: {type(self).__name__} cannot")

    # --- reading ----------------------------------------------------------------------------

    def node(self, name: str) -> NodeInfo:
        """One node; UsageError naming the known nodes when it does not exist."""
        validate_node_name(name)
        nodes = self.nodes()
        for n in nodes:
            if n.name == name:
                return n
        raise unknown_choice("node", name, [n.name for n in nodes])

    def job(self, job_id: str | int) -> JobInfo:
        """One job; UsageError when slurmctld does not know it."""
        jid = validate_job_id(job_id)
        for j in self.jobs():
            if j.job_id == jid:
                return j
        raise UsageError(f"Unknown job {jid}: slurmctld does not know it (finished long ago?)")

    def jobs_on(self, node: str) -> list[JobInfo]:
        """Running or completing jobs that use ``node``."""
        self.node(node)
        return [j for j in self.jobs() if j.uses(node)]

    # --- nodes ------------------------------------------------------------------------------

    def down(self, node: str, reason: str) -> bool:
        """Set ``node`` DOWN with our reason (``recover:`` is prepended when missing); Slurm
        requeues the requeueable jobs on it and ends the others.

        Returns False (no-op) when it already is DOWN with that reason, or DOWN for someone
        else's reason (which is kept). A node drained by someone else is set DOWN keeping
        their reason, so that our resume never puts it back.
        """
        return self._take_out(node, "DOWN", reason)

    def drain(self, node: str, reason: str) -> bool:
        """Set ``node`` DRAIN with our reason; running jobs keep running, no new ones start.
        A DOWN node becomes DOWN+DRAIN.

        Returns False (no-op) when it already is drained with that reason, or out of
        service for someone else's reason (which is kept).
        """
        return self._take_out(node, "DRAIN", reason)

    def _take_out(self, node: str, state: str, reason: str) -> bool:
        text = mark(reason)
        why = take_out_reason(self.node(node), state, text)
        if why is None:
            return False
        try:
            self._request_update([node], state, why)
        except SlurmRefusedError:
            # Refused because Slurm got there first (the state we wanted already holds)?
            if take_out_reason(self.node(node), state, text) is None:
                return False
            raise
        return True

    def resume(self, node: str, *, force: bool = False) -> bool:
        """Return ``node`` to service if the mark on it is ours (or ``force``).

        False (no-op) when it is already in service, also when it returned by itself between
        our read and our write (slurmd registering again). Raises ReasonNotOursError naming
        the current reason and who set it when the mark is not ours; an empty reason is not
        ours either (we did not take the node out, so we do not put it back).
        """
        if not resume_needed(self.node(node), force=force):
            return False
        try:
            self._request_resume(node)
        except SlurmRefusedError:
            # "Invalid node state specified": the node is no longer DOWN or DRAIN.
            if not self.node(node).out_of_service:
                return False
            raise
        return True

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        """:meth:`down` for several nodes in one request per reason written; returns the nodes
        that changed, sorted."""
        return self._take_out_many(nodes, "DOWN", reason)

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        """:meth:`drain` for several nodes in one request per reason written; returns those
        changed, sorted."""
        return self._take_out_many(nodes, "DRAIN", reason)

    def _take_out_many(self, nodes: Sequence[str], state: str, reason: str) -> list[str]:
        text = mark(reason)
        for n in nodes:
            validate_node_name(n)
        known = {n.name: n for n in self.nodes()}
        unknown = [n for n in nodes if n not in known]
        if unknown:
            raise unknown_choice("node", unknown[0], known)
        changed: list[str] = []
        for why, names in take_out_plan((known[n] for n in nodes), state, text).items():
            try:
                self._request_update(names, state, why)
            except SlurmRefusedError:
                now = {n.name: n for n in self.nodes()}
                if any(take_out_reason(now[n], state, text) is not None for n in names):
                    raise
                continue  # every node of the group already holds: none changed by us
            changed += names
        return sorted(changed)

    # --- jobs -------------------------------------------------------------------------------

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        """Send ``signal`` to a running job (which part of it receives the signal depends on
        the backend: see its ``_request_signal``). False (no-op) when the job is not running,
        also when it ended between our read and the signal."""
        jid = validate_job_id(job_id)
        if not _SIGNAL_RE.fullmatch(signal):
            raise UsageError(f"Invalid signal {signal!r}: expected a name such as USR1 or TERM")
        if not self._job_state_is(jid, {"RUNNING"}):
            return False
        try:
            self._request_signal(jid, signal)
        except SlurmRefusedError:
            if not self._job_state_is(jid, {"RUNNING"}):
                return False
            raise
        return True

    def requeue(self, job_id: str | int) -> bool:
        """Requeue a job (it goes back to PENDING, restart count + 1). False (no-op) when it is
        already pending or being requeued.

        A job Slurm requeued in held state (``REQUEUE_HOLD``: Slurm 25.11 holds an expedited
        job whose script failed while no Epilog failed) is released instead: it is queued
        already, and only waits for someone to let it run."""
        jid = validate_job_id(job_id)
        info = self.job(jid)
        if info.state == "REQUEUE_HOLD":  # released already (no reason left): waits to start
            if not info.requeue_held:
                return False
            self._request_release(jid)
            return True
        if not requeue_needed(info):
            return False
        try:
            self._request_requeue(jid)
        except SlurmRefusedError as e:
            if _ALREADY_REQUEUED.search(str(e)) or not requeue_needed(self.job(jid)):
                return False
            raise
        return True

    def requeue_ended(self, job_id: str | int, restart_count: int) -> bool:
        """Requeue a job that ended, while it is still finished at ``restart_count``
        (:func:`requeue_ended_needed`, from a read just before the request). False (no-op)
        when it is not, also when that changed between our read and the request.

        Slurm 25.11 may have requeued that run itself and held it (:func:`release_held_needed`:
        an expedited job whose script failed while no Epilog failed, which happens when the
        training died before the fault was reported); it is released instead."""
        jid = validate_job_id(job_id)
        info = self.job(jid)
        if release_held_needed(info, restart_count):
            self._request_release(jid)
            return True
        if not requeue_ended_needed(info, restart_count):
            return False
        try:
            self._request_requeue(jid)
        except SlurmRefusedError:
            if not requeue_ended_needed(self.job(jid), restart_count):
                return False
            raise
        return True

    def cancel(self, job_id: str | int) -> bool:
        """Cancel a job. False (no-op) when it had already finished or slurmctld forgot it,
        also when it finished between our read and the cancel."""
        jid = validate_job_id(job_id)
        if not self._job_state_is(jid, None):
            return False
        try:
            self._request_cancel(jid)
        except SlurmRefusedError:
            if not self._job_state_is(jid, None):
                return False
            raise
        return True

    def _job_state_is(self, jid: str, states: frozenset[str] | set[str] | None) -> bool:
        """Whether slurmctld knows job ``jid`` in one of ``states`` (None: any state that is
        not finished). A job it forgot is in none."""
        try:
            info = self.job(jid)
        except UsageError:
            return False
        return info.active if states is None else info.state in states
