"""Which ended jobs the coordinator requeues: pure rules over Slurm's view of one job.

A fault that kills accelerator work (XID 79, a lost GPU) kills the training process at once,
while slurmd and the batch shell live on: the batch script ends with the process's status
(134 for SIGABRT), Slurm records the job FAILED and, seeing nothing wrong with the node, does
not requeue it. Whether that happens before, at the same moment as, or after the coordinator
takes the node out is a race. Slurm requeues a ``--requeue`` job itself only when it is still
running on the node at the take-out; a job that ended a moment earlier is the coordinator's
to bring back (``scontrol requeue`` of a FAILED job restarts it from its checkpoint).

The rules, each with the reason the incident records:

* a job is the fault's when it ran on the faulted node and ended abnormally
  (:data:`ABNORMAL_END_STATES`) no earlier than ``window_s`` before the fault, or while the
  incident was watching it (it was on the node when the fault was decided);
* the coordinator requeues it once its run ended at the restart count it had there; a job
  whose restart count rose since was requeued already (by Slurm, its wrapper or an
  operator) and is left alone;
* never a job that exited with :data:`EXIT_DO_NOT_RESTART`, never one submitted with
  ``--no-requeue`` (Slurm refuses), and at most ``budget`` times per job within
  ``budget_window_s``: a bug in the job's own code that crashes it (and trips a
  consequence XID) again and again is not requeued forever;
* a job that ended on a node with no incident is never the coordinator's business;
* Slurm 25.11 requeues an expedited job (``--requeue=expedite``) whose script failed by
  itself, but holds it (``REQUEUE_HOLD``, its restart count already one higher) when no
  Epilog failed: our Epilog fails only for a node with an open incident, so a job whose
  training died before the fault was reported is held. Such a held run is the fault's as
  if it had ended FAILED; releasing it is its requeue (:func:`held_by_slurm`), under the same
  rules (the do-not-restart status, the budget).

Time: Unix seconds (Slurm's end times and the coordinator's wall clock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from recovery.contract.exits import EXIT_DO_NOT_RESTART
from recovery.ports.slurm import JobInfo

#: Job states that a hard fault on a node can leave: the batch script failed (the training
#: process died), the node failed under a job Slurm would not requeue, or the node did not
#: boot. Not COMPLETED, CANCELLED (a person's choice), TIMEOUT, PREEMPTED, DEADLINE or
#: OUT_OF_MEMORY (host memory: the job's own doing, which a restart repeats).
ABNORMAL_END_STATES = frozenset({"FAILED", "NODE_FAIL", "BOOT_FAIL"})


@dataclass(frozen=True)
class RequeueConfig:
    """When the coordinator requeues a job that ended on a node taken out for a fault."""

    window_s: float = 120.0
    """A job that ended abnormally on the node at most this many seconds before the fault is
    the fault's (a process dies at once on a lost GPU; the event may take a while to arrive).
    Keep it below slurmctld's ``MinJobAge`` (300 s by default), after which Slurm forgets an
    ended job and nothing can requeue it."""
    budget: int = 3
    """The most requeues the coordinator makes of one job within ``budget_window_s``."""
    budget_window_s: float = 3600.0
    """Length of the budget's sliding window, in seconds. A job that keeps failing faster than
    the budget allows is left ended; a long run that loses a node every few hours is not."""


@dataclass(frozen=True)
class Judgement:
    """What to do about one ended job: requeue it or not, and why (recorded as said)."""

    requeue: bool
    why: str


def ended_abnormally(job: JobInfo) -> bool:
    """The job finished in one of :data:`ABNORMAL_END_STATES`."""
    return job.state in ABNORMAL_END_STATES


def held_by_slurm(job: JobInfo, ran_at: int) -> bool:
    """Slurm requeued ``job``'s run ``ran_at`` itself and holds it (``REQUEUE_HOLD`` at
    ``ran_at + 1``: Slurm 25.11's expedited requeue of a failed script with no failed
    Epilog)."""
    return job.held_after(ran_at)


def describe_end(job: JobInfo) -> str:
    """How ``job`` ended, for the record: ``FAILED exit 134``, ``FAILED signal 9``,
    ``NODE_FAIL``; ``FAILED exit 134, held by Slurm`` for a run Slurm requeued in held
    state (:func:`held_by_slurm`)."""
    if job.requeue_held:
        how = f"exit {job.exit_code}" if job.exit_code else "a failure"
        return f"FAILED {how}, held by Slurm"
    if job.signal:
        return f"{job.state} signal {job.signal}"
    if job.exit_code:
        return f"{job.state} exit {job.exit_code}"
    return job.state


def lost_batch_host(job: JobInfo, node: str, ran_at: int) -> bool:
    """``job``'s run ``ran_at`` goes on without its batch script: its batch host ``node`` is
    gone and Slurm dropped it from the job instead of ending the job (a ``--no-kill`` job
    on Slurm 25.11 whose batch host went DOWN). Nothing but its time limit would end it, and
    nothing supervises its steps any more, so it is judged as a run the fault ended."""
    return (
        bool(job.batch_host)
        and job.batch_host == node
        and job.state == "RUNNING"
        and job.restart_count == ran_at
        and node not in job.nodes
    )


def judge_headless(job: JobInfo, *, used: int, config: RequeueConfig) -> Judgement:
    """:func:`judge` for a run that lost its batch host (:func:`lost_batch_host`)."""
    end = f"RUNNING without its batch host {job.batch_host} (its batch script died there)"
    return _requeue_unless_refused(job, end, used=used, config=config)


def _requeue_unless_refused(
    job: JobInfo, end: str, *, used: int, config: RequeueConfig
) -> Judgement:
    """Requeue a run that ended as ``end`` says, unless ``--no-requeue`` or the budget refuse."""
    if not job.requeueable:
        return Judgement(False, f"{end}: submitted with --no-requeue, so Slurm will not requeue it")
    if used >= config.budget:
        return Judgement(
            False,
            f"{end}: restart budget spent (requeued {used} time(s) in the last "
            f"{config.budget_window_s:g} s; at most {config.budget})",
        )
    return Judgement(True, end)


def ended_on(job: JobInfo, node: str, since: float, until: float) -> bool:
    """``job`` ran on ``node`` and ended abnormally between ``since`` and ``until`` (Unix
    seconds, both included). A job whose end time Slurm did not give (0) never matches."""
    return (
        ended_abnormally(job)
        and node in job.nodes
        and job.end_time > 0
        and since <= job.end_time <= until
    )


def budget_used(requeued_at: Iterable[float], now: float, config: RequeueConfig) -> int:
    """How many of the coordinator's requeues of one job (their times) count against its
    budget at ``now``: those within ``budget_window_s``."""
    return sum(1 for at in requeued_at if now - at < config.budget_window_s)


def judge(job: JobInfo, ran_at: int, *, used: int, config: RequeueConfig) -> Judgement | None:
    """Whether to requeue ``job``, whose run number ``ran_at`` (its restart count then) was
    on the faulted node; ``used`` is how much of its budget is spent (:func:`budget_used`).

    None when it is not ours to judge: still live, requeued since (a higher restart count),
    or ended in a way no fault causes (completed, cancelled, timed out). Otherwise a
    :class:`Judgement`: requeue it, or refuse with the reason (the do-not-restart status,
    ``--no-requeue``, the budget). A run Slurm requeued but holds (:func:`held_by_slurm`)
    is judged as a failed one: its requeue is its release.
    """
    held = held_by_slurm(job, ran_at)
    if not held and (not job.finished or job.restart_count != ran_at or not ended_abnormally(job)):
        return None
    end = describe_end(job)
    if job.exit_code == EXIT_DO_NOT_RESTART and not job.signal:
        return Judgement(False, f"{end}: exit {EXIT_DO_NOT_RESTART} asks not to be restarted")
    return _requeue_unless_refused(job, end, used=used, config=config)
