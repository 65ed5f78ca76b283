"""The job's restarts as its own event log tells them: what each had to do again, and the
spans between its events. Pure: processes in, values out.

A restart is every process after the first (:func:`recovery.report.processes.split_processes`
cuts the log at each ``started``). Its lost progress is counted here and only here: the
furthest step any earlier process reached before it started, minus the step it resumed from
(the checkpoint it restored, or 0). The count reads ``started``, ``restored`` and ``step``
events alone, so a loop that writes no ``warmup`` (it is optional) counts the same. An
incident's ``steps_recomputed`` (:mod:`recovery.report.phases`) and a scenario's
``max_steps_recomputed`` both come from :func:`redo`.

Without the coordinator's journal the time between two processes cannot be split into
detection, take-out and requeue; :class:`Restart` keeps it whole as ``gap``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recovery.report.processes import Fallback, Process

#: What a restart shows without a journal, in the order reports show them: ``gap`` (the
#: process before stopped -> this one started), then the incident phases of the same names
#: (:data:`recovery.report.phases.PHASES`).
RESTART_PHASES: tuple[str, ...] = ("gap", "restore", "warmup", "recompute", "no_progress")


@dataclass(frozen=True)
class Redo:
    """What one restart had to do again."""

    high_water_step: int | None
    """The furthest step the processes before it reached before it started (None: none)."""
    last_before: float | None
    """When that step was reached (wall seconds)."""
    resumed_step: int
    """The step it trained from: the checkpoint it restored, or 0."""
    steps_recomputed: int
    """``high_water_step - resumed_step``, never below 0."""
    caught_up: float | None
    """When it reached ``high_water_step`` again (wall seconds; the start of its first update
    when nothing was redone); None: it never did."""
    progress: float | None
    """When its first update past ``high_water_step`` ended; None: it made none."""

    @property
    def target(self) -> int:
        """The step to get back to (0 when nothing was reached before)."""
        return self.high_water_step or 0


def high_water(
    processes: Sequence[Process], before: int | None = None
) -> tuple[int | None, float | None]:
    """The furthest step the processes before index ``before`` reached before process
    ``before`` started (every process's, when None), and when it was reached."""
    until = processes[before].started if before is not None else float("inf")
    done = [s for p in processes[:before] for s in p.steps if s.ts <= until]
    high = max((s.step for s in done), default=None)
    last = max((s.ts for s in done if s.step == high), default=None)
    return high, last


def redo(processes: Sequence[Process], index: int) -> Redo:
    """What process ``index`` (a restart: index >= 1) had to do again."""
    p = processes[index]
    high, last = high_water(processes, index)
    target = high or 0
    resumed = p.restored_step or 0
    recomputed = max(0, target - resumed)
    first = p.first_step_start
    reached = p.step_at(target)
    caught = first if recomputed == 0 else (reached.ts if reached else None)
    beyond = p.first_beyond(target)
    return Redo(high, last, resumed, recomputed, caught, beyond.ts if beyond else None)


def steps_recomputed(processes: Sequence[Process]) -> int:
    """Steps done again over the whole log: :attr:`Redo.steps_recomputed` summed over every
    process after the first."""
    return sum(redo(processes, i).steps_recomputed for i in range(1, len(processes)))


def redo_why(p: Process, r: Redo) -> dict[str, str]:
    """Why a phase of restart ``p`` did not happen, for those that did not: ``restore``,
    ``warmup``, ``recompute``, ``no_progress``."""
    why: dict[str, str] = {}
    if p.restored_at is None:
        why["restore"] = "the new process found no checkpoint and started from step 0"
    if p.first_step_start is None:
        why["warmup"] = why["recompute"] = "the new process made no update"
    elif r.caught_up is None:
        why["recompute"] = f"the new process never got back to step {r.target}"
    if r.progress is None:
        why["no_progress"] = f"no update past step {r.target} after the restart"
    return why


def span(a: float | None, b: float | None) -> float | None:
    """Seconds from ``a`` to ``b`` (never negative); None when either is unknown."""
    return None if a is None or b is None else max(0.0, b - a)


@dataclass(frozen=True)
class Restart:
    """One process after the first, as the job's own events tell it (no journal needed)."""

    index: int
    """Of the process in :attr:`recovery.report.model.Report.processes`."""
    node: str | None
    restart_count: int | None
    """Slurm's count for the process (None outside Slurm)."""
    before: str
    """How the process before it ended: ``completed``, ``preempted`` or ``killed``."""
    restored_step: int | None
    fallbacks: tuple[Fallback, ...]
    high_water_step: int | None
    steps_recomputed: int
    phases: dict[str, float | None]
    """Seconds per name of :data:`RESTART_PHASES`; None when it did not happen (``why``)."""
    why: dict[str, str]
    marks: dict[str, float]
    """The instants the phases run between (wall seconds): ``stopped`` (the last event of
    the process before), ``started``, ``restored``, ``first_step``, ``caught_up``,
    ``progress``, ``last_step_before``."""


def restart(processes: Sequence[Process], index: int) -> Restart:
    """Restart ``index`` (>= 1) of ``processes``."""
    p, prev = processes[index], processes[index - 1]
    r = redo(processes, index)
    first = p.first_step_start
    marks = {
        "stopped": prev.end,
        "started": p.started,
        "restored": p.restored_at,
        "first_step": first,
        "caught_up": r.caught_up,
        "progress": r.progress,
        "last_step_before": r.last_before,
    }
    phases = {
        "gap": span(prev.end, p.started),
        "restore": span(p.started, p.restored_at),
        "warmup": span(p.restored_at if p.restored_at is not None else p.started, first),
        "recompute": span(first, r.caught_up),
        "no_progress": span(r.last_before if r.last_before is not None else prev.end, r.progress),
    }
    return Restart(
        index=p.index,
        node=p.node,
        restart_count=p.restart_count,
        before=prev.outcome,
        restored_step=p.restored_step,
        fallbacks=p.fallbacks,
        high_water_step=r.high_water_step,
        steps_recomputed=r.steps_recomputed,
        phases=phases,
        why={k: v for k, v in redo_why(p, r).items() if phases.get(k) is None},
        marks={k: v for k, v in marks.items() if v is not None},
    )


def restarts(processes: Sequence[Process]) -> tuple[Restart, ...]:
    """Every restart of the job: each process after the first, in order."""
    return tuple(restart(processes, i) for i in range(1, len(processes)))
