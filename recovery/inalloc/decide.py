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

The rest of the supervisor's rules are here too: a launch's status from its processes'
(:func:`launch_status`), when srun's status is overruled (:func:`checked_status`,
:func:`status_after_leaving`), which nodes are lost (:func:`lost_among`) and how long to wait
for one (:func:`lost_wait_over`), what a forwarded USR1 is about (:func:`time_limit_warning`,
:func:`usr1_about`, :func:`leave_step`), what follows a step a signal stopped
(:func:`after_signalled_step`), and what the batch script is told (:func:`decision_line`,
:func:`exit_status`).

Nodes are named as Slurm names them. Nothing here talks to Slurm or reads a clock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from recovery.contract.exits import EXIT_FAILED, EXIT_KILLED, EXIT_PREEMPTED

#: Relaunches one job may make before it falls back to a requeue.
DEFAULT_MAX_RELAUNCHES = 3
#: A USR1 that comes this many seconds after the job lost a node, or while a node of the step
#: is lost, is the coordinator's "save and leave" for that node (see :func:`usr1_about`).
RECENT_LOSS_S = 120.0
#: Seconds before the lead of Slurm's own USR1 warning (``--signal``) within which a USR1
#: is always taken as the warning of the time limit, whatever node was lost.
TIME_LIMIT_MARGIN_S = 60.0


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
    why: str = ""


@dataclass(frozen=True)
class Requeue:
    """Give up the allocation: the batch script requeues the job (today's path)."""

    lost: tuple[str, ...]
    why: str


StepDecision = Finish | Relaunch | Requeue


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
) -> StepDecision:
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
        if status == EXIT_KILLED and relaunches < max_relaunches:
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


def after_hang(
    layout: Layout,
    culprits: Sequence[str],
    *,
    hung_before: Sequence[str],
    relaunches: int,
    max_relaunches: int,
) -> Relaunch | Requeue:
    """What follows a launch the supervisor ended because it stopped making progress
    (:mod:`recovery.progress.stall`). ``culprits``: the nodes of the processes it was
    attributed to with confidence (empty: nobody could be named); ``hung_before``: those of
    the launch before, when that one hung too.

    A hang is the process's, not the node's, until it repeats: the first is relaunched on
    the same nodes (their standbys are up; no node is given back on a guess). A node named
    again for the next launch's hang is swapped for a spare and given back to Slurm, when a
    spare is left (not the batch host: the batch script runs there). With the relaunch budget
    spent the job requeues."""
    if relaunches >= max_relaunches:
        return Requeue(
            (), f"the launch hung and the restart budget is spent ({max_relaunches} relaunches)"
        )
    again = [
        n for n in culprits if n in hung_before and n in layout.step and n != layout.batch_host
    ]
    spares = layout.spares
    if again and len(spares) >= len(again):
        taken = iter(spares[: len(again)])
        nodes = tuple(next(taken) if n in again else n for n in layout.step)
        why = f"hung again on {', '.join(again)}: relaunched without it, on a spare"
        return Relaunch(nodes, (), tuple(again), spares[len(again) :], why)
    why = "hung: relaunched on the same nodes"
    if again:
        why += f" (hung again on {', '.join(again)}, but no spare is left)"
    return Relaunch(layout.step, (), (), spares, why)


def swap_gain(step_s: float, peers_s: float, steps_left: int) -> float:
    """Seconds a relaunch without a straggler would save: its excess a step, times the steps
    still to train."""
    return max(0.0, step_s - peers_s) * max(0, steps_left)


def after_slow(
    layout: Layout,
    node: str,
    *,
    gain_s: float,
    cost_s: float,
    relaunches: int,
    max_relaunches: int,
) -> Relaunch | str:
    """A relaunch without the slow ``node`` (on a spare, the node given back), when it is
    worth it: ``gain_s`` (:func:`swap_gain`) above ``cost_s`` (what a relaunch costs), a spare
    and a relaunch left, and ``node`` not the batch host. Otherwise why not: the straggler is
    only reported."""
    if node not in layout.step:
        return f"{node} is not in the step"
    if node == layout.batch_host:
        return f"{node} runs the batch script: it cannot be given back"
    if not layout.spares:
        return "no spare is left in the job"
    if relaunches >= max_relaunches:
        return f"the restart budget is spent ({max_relaunches} relaunches)"
    if gain_s <= cost_s:
        return f"it would save {gain_s:.1f} s, not more than a relaunch costs ({cost_s:.1f} s)"
    spare = layout.spares[0]
    nodes = tuple(spare if n == node else n for n in layout.step)
    why = (
        f"{node} is slow: relaunched on the spare {spare}, saving about {gain_s:.1f} s "
        f"for a relaunch of about {cost_s:.1f} s"
    )
    return Relaunch(nodes, (), (node,), layout.spares[1:], why)


def next_layout(layout: Layout, relaunch: Relaunch) -> Layout:
    """The layout after ``relaunch``."""
    return Layout(relaunch.nodes, relaunch.spares_left, layout.batch_host)


def ended_cleanly(status: int) -> bool:
    """True for a status that completed (0) or saved and stopped on a signal
    (:data:`~recovery.contract.exits.EXIT_PREEMPTED`): neither failed."""
    return status in (0, EXIT_PREEMPTED)


def launch_status(statuses: Sequence[int]) -> int:
    """One launch's status from its processes', in the order they ended: the first failure
    (the cause: the others end after it, 76 for a lost peer); else 75 when any saved and
    stopped on a signal; else 0."""
    for status in statuses:
        if not ended_cleanly(status):
            return status
    return EXIT_PREEMPTED if EXIT_PREEMPTED in statuses else 0


def lost_among(
    watched: Sequence[str], held: Collection[str], bad: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Of the ``watched`` nodes, those lost, and those of them Slurm already dropped: the ones
    the job no longer holds (``held``: its nodes now) first, then those of ``bad`` (the held
    ones Slurm reports DOWN, DRAIN, FAIL or not responding)."""
    dropped = [n for n in watched if n not in held]
    return dropped + [n for n in bad if n not in dropped], dropped


def checked_status(status: int, step_lost: Sequence[str]) -> int:
    """``status``, or :data:`~recovery.contract.exits.EXIT_FAILED` when it ended cleanly and
    ``step_lost`` (the step's lost nodes) is not empty: srun can report 0 for a step whose node
    failed under it (seen with one task: "srun: error: Node failure"), and a job that ended its
    training early must not finish as complete. A relaunch of a run that did complete costs
    little: it restores the final checkpoint and stops."""
    return EXIT_FAILED if step_lost and ended_cleanly(status) else status


def status_after_leaving(status: int) -> int:
    """The status of a step that saved and stopped to leave a lost node (the coordinator's
    "save and leave"): a clean one becomes :data:`~recovery.contract.exits.EXIT_FAILED`, so
    that the step is relaunched without the node, as after a failure."""
    return EXIT_FAILED if ended_cleanly(status) else status


def lost_wait_over(layout: Layout, lost: Sequence[str], waited_s: float, grace_s: float) -> bool:
    """Whether the wait, after a failed step, for Slurm to name a lost node is over: a node
    of the step is among ``lost``, or ``grace_s`` seconds passed (``waited_s`` so far). The
    coordinator's verdict may trail the crash it caused by a moment."""
    return any(n in layout.step for n in lost) or waited_s >= grace_s


def time_limit_warning(time_left: float | None, signal_lead_s: float) -> bool:
    """Whether a USR1 that comes ``time_left`` seconds before the job's time limit (None: no
    limit, or unknown) is Slurm's warning of that limit, sent ``signal_lead_s`` seconds ahead
    (``--signal``): no more is left than the lead and :data:`TIME_LIMIT_MARGIN_S`."""
    return time_left is not None and time_left <= signal_lead_s + TIME_LIMIT_MARGIN_S


def usr1_about(
    lost: Sequence[str],
    batch_host: str,
    since_loss_s: float | None,
    lost_before: Sequence[str],
) -> tuple[str, ...] | None:
    """The lost nodes a USR1 that is not the time limit's warning is about: ``lost`` (the
    job's nodes lost now); else ``lost_before`` (those of the job's last loss) when that loss
    was ``since_loss_s`` seconds ago (None: none yet), at most :data:`RECENT_LOSS_S`. None: it
    is not about a node (an operator's), and it stops the step and the job; so is a USR1 while
    the batch host is lost: the job cannot give back the node its batch script runs on, and
    leaving it means leaving the allocation (save, and the batch script requeues the job)."""
    if batch_host in lost:
        return None
    if lost:
        return tuple(lost)
    if since_loss_s is not None and since_loss_s <= RECENT_LOSS_S:
        return tuple(lost_before)
    return None


def leave_step(layout: Layout, about: Sequence[str]) -> tuple[str, ...]:
    """Of the lost nodes a USR1 is about (:func:`usr1_about`), those the step trains on: the
    step saves, then goes on without them. Empty: the job no longer trains on any of them,
    and the signal is ignored."""
    return tuple(n for n in about if n in layout.step)


def after_signal(status: int, signal_name: str) -> Finish | Requeue:
    """The end of a step that the forwarded signal ``signal_name`` stopped. Saved (75) or
    complete (0): the step's status (after a USR1 the batch script requeues). Anything else -
    the signal came while a relaunch was starting, before the training could save (the
    coordinator's "save and leave" for a node the job already gave back does that) -
    requeues: ending the job with it would lose the run, and the newest checkpoint and the
    survivors' memory copies are there to resume from."""
    if ended_cleanly(status):
        return Finish(status, f"the step ended after {signal_name}")
    return Requeue((), f"{signal_name} stopped the step before it could save (status {status})")


def after_signalled_step(
    layout: Layout, status: int, signal_name: str, *, relaunches: int, max_relaunches: int
) -> StepDecision:
    """What follows a step that ended with ``status`` after the forwarded signal
    ``signal_name`` asked the job to stop: no lost node is waited for, and where
    :func:`after_step` would end the job, :func:`after_signal` decides how."""
    decision = after_step(
        layout, status, lost=(), dropped=(), relaunches=relaunches, max_relaunches=max_relaunches
    )
    return after_signal(status, signal_name) if isinstance(decision, Finish) else decision


def decision_line(decision: StepDecision) -> str:
    """What the batch script reads: ``exit N`` or ``requeue``."""
    if isinstance(decision, Requeue):
        return "requeue"
    if isinstance(decision, Finish):
        return f"exit {decision.status}"
    raise ValueError(f"not a final decision: {decision!r}")


def exit_status(decision: StepDecision) -> int:
    """The supervisor's own exit status after ``decision``: a :class:`Finish`'s status, 0
    after a :class:`Requeue` (the batch script requeues on :func:`decision_line`). Raises
    ValueError for a :class:`Relaunch`, which is no final decision."""
    if isinstance(decision, Requeue):
        return 0
    if isinstance(decision, Finish):
        return decision.status
    raise ValueError(f"not a final decision: {decision!r}")
