"""What the job supervisor does when its training step ends: the pure rules.

The supervisor (:mod:`recovery.inalloc.supervisor`) runs in the batch step of a job that
asked for K training nodes plus S spares with ``--no-kill``. When the step ends it asks
Slurm which of the step's nodes are gone (dropped from the job, DOWN, or DRAIN) and
:func:`after_step` decides:

* the step completed (0) or saved and stopped on a forwarded signal (75): the job ends
  with that status, the batch script does the rest (its USR1 requeue);
* a node of the step is lost and the job still holds enough idle nodes and relaunches:
  relaunch on the survivors plus spares (:class:`Relaunch`);
* a node is lost but no spare or no relaunch is left: :class:`Requeue` (today's path:
  the job returns to the queue and ``--auto-resume`` continues it);
* the step failed and no node is lost: :class:`Finish` with its status; a fault on no
  node is the training code's, and relaunching it would only fail again. Except a process
  SIGKILLed from outside (137): relaunched on the same nodes, within the budget.

Nodes are named as Slurm names them. Nothing here talks to Slurm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recovery.contract.exits import EXIT_PREEMPTED

#: Relaunches one job may make before it falls back to a requeue.
DEFAULT_MAX_RELAUNCHES = 3
#: A step status of a process killed by SIGKILL (128 + 9).
KILLED = 137


@dataclass(frozen=True)
class Finish:
    """End the job with ``status`` (the step's own, or 0)."""

    status: int
    why: str


@dataclass(frozen=True)
class Relaunch:
    """Launch the step again on ``nodes`` (the first runs process 0); ``lost`` are the step's
    nodes that are gone and ``release`` those the job must give back to Slurm itself (a
    DRAIN node stays in the job until released; a DOWN one Slurm drops)."""

    nodes: tuple[str, ...]
    lost: tuple[str, ...]
    release: tuple[str, ...]
    spares_left: tuple[str, ...]


@dataclass(frozen=True)
class Requeue:
    """Give up the allocation: the batch script requeues the job (today's path)."""

    lost: tuple[str, ...]
    why: str


Decision = Finish | Relaunch | Requeue


@dataclass(frozen=True)
class Layout:
    """Which of the job's nodes train and which wait. ``batch_host`` runs the supervisor; it
    is the last spare used (Slurm never drops the batch host from a job: its loss ends the
    job whatever it ran)."""

    step: tuple[str, ...]
    spares: tuple[str, ...]
    batch_host: str


def first_layout(job_nodes: Sequence[str], batch_host: str, processes: int) -> Layout:
    """The first step's nodes: ``processes`` of ``job_nodes``, the batch host last.

    Raises ValueError when the job holds fewer nodes than processes (sbatch refused that
    already unless the allocation shrank before the supervisor started)."""
    if processes < 1:
        raise ValueError(f"invalid process count {processes}: expected 1 or more")
    if len(job_nodes) < processes:
        raise ValueError(
            f"the job holds {len(job_nodes)} node(s) ({', '.join(job_nodes) or 'none'}) "
            f"for {processes} processes"
        )
    order = [n for n in job_nodes if n != batch_host]
    if batch_host in job_nodes:
        order.append(batch_host)
    return Layout(tuple(order[:processes]), tuple(order[processes:]), batch_host)


def after_step(
    layout: Layout,
    status: int,
    *,
    lost: Sequence[str],
    dropped: Sequence[str],
    relaunches: int,
    max_relaunches: int,
) -> Decision:
    """Decide what follows a step that ended with ``status``.

    ``lost``: the job's nodes Slurm reports gone (DOWN, DRAIN, FAIL, or no longer in the
    job), whether they ran the step or waited as spares; ``dropped``: those of them already
    out of the job (Slurm dropped them), which need no release. ``relaunches``: how many
    relaunches were made so far.
    """
    lost_set = set(lost)
    spares = tuple(n for n in layout.spares if n not in lost_set)
    step_lost = tuple(n for n in layout.step if n in lost_set)
    if status == 0:
        return Finish(0, "the training step completed")
    if status == EXIT_PREEMPTED:
        return Finish(status, "the training step saved and stopped on a signal")
    if not step_lost:
        if status == KILLED and relaunches < max_relaunches:
            # SIGKILLed from outside with every node in service: the kernel's OOM killer, or
            # slurmctld ending a requeued job's old run on a node that just came back (its
            # kill reaches the new run's step of the same job id). A relaunch on the same
            # nodes may well succeed; a training bug exits by itself, not by SIGKILL.
            return Relaunch(nodes=layout.step, lost=(), release=(), spares_left=spares)
        return Finish(status, f"the training step failed (status {status}) and no node is lost")
    if layout.batch_host in lost_set:
        return Requeue(step_lost, f"the batch host {layout.batch_host} is lost")
    if relaunches >= max_relaunches:
        return Requeue(step_lost, f"the restart budget is spent ({max_relaunches} relaunches)")
    if len(spares) < len(step_lost):
        return Requeue(
            step_lost,
            f"{len(step_lost)} node(s) lost ({', '.join(step_lost)}) and "
            f"{len(spares)} spare(s) left in the job",
        )
    survivors = [n for n in layout.step if n not in lost_set]
    taken = list(spares[: len(step_lost)])
    # The spares list keeps the batch host last, so it is taken only when nothing else is left.
    dropped_set = set(dropped)
    release = tuple(n for n in lost if n not in dropped_set and n != layout.batch_host)
    return Relaunch(
        nodes=tuple(survivors + taken),
        lost=step_lost,
        release=release,
        spares_left=spares[len(step_lost) :],
    )


def next_layout(layout: Layout, relaunch: Relaunch) -> Layout:
    """The layout after ``relaunch``."""
    return Layout(relaunch.nodes, relaunch.spares_left, layout.batch_host)
