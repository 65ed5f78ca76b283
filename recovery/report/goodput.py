"""Goodput and badput over a run, in the buckets of Google's goodput accounting.

Every instant of the run's wall time (``run.json`` ``started`` to ``finished``) goes to
exactly one bucket, so the buckets and the productive time add up to the wall time:

* productive: updates whose result survives into the final state (from the end of the
  previous update, or the update's own start for a process's first, to its end);
* program startup: from the run's start to its first process, and in each process from
  ``started`` to its first update (interpreter and JAX start, compilation, warmup), less
  the restore;
* checkpoint restore: the ``restored`` event's own ``restore_s`` (read and verify);
* checkpoint save blocking: the time the loop waited to hand a save over (``blocked_s``),
  and the save a process makes after its last update (final, or on a signal);
* wasted progress from disruption: updates thrown away because a later process restored
  from an older checkpoint (they are done again, and the redo counts as productive);
* infrastructure recovery from disruption: from the end of a process to the start of the
  next (detection, take-out, requeue, replacement, scheduling), or to the end of the run when
  the last process stopped short of completing;
* other: whatever is left (after the job completed, gaps the log does not explain).

Two buckets of our own split what those would hide, when the report knows of them:

* hung until stopped: from a stall (a hung or frozen rank) to every process of the job
  stopped; taken out of infrastructure recovery and other, where a process that wrote nothing
  after its last update would otherwise put that time;
* slowed by a straggler: while a slow node was in the job, what each update took beyond the
  healthy step time (:mod:`recovery.report.slowdown`); taken out of the update's own bucket.

A job of K processes (one per node) is accounted in process-seconds: each process's time is
cut into the buckets as above from its own event log, and the totals are summed, so the
wall time counts K times (what K nodes were held for) and the shares stay fractions of it.

Pure: processes in, seconds out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recovery.report.processes import Process, kept_through

PRODUCTIVE = "productive"
PROGRAM_STARTUP = "program_startup"
CHECKPOINT_RESTORE = "checkpoint_restore"
CHECKPOINT_SAVE = "checkpoint_save_blocking"
WASTED_PROGRESS = "wasted_progress_from_disruption"
INFRA_RECOVERY = "infrastructure_recovery_from_disruption"
OTHER = "other"
HUNG = "hung_until_stopped"
STRAGGLER = "slowed_by_a_straggler"
#: The badput buckets, in the order reports show them.
BADPUT = (
    PROGRAM_STARTUP,
    CHECKPOINT_RESTORE,
    WASTED_PROGRESS,
    INFRA_RECOVERY,
    HUNG,
    STRAGGLER,
    CHECKPOINT_SAVE,
    OTHER,
)


@dataclass(frozen=True)
class SlowWindow:
    """While a slow node was in the job: updates ending in ``begin..end`` that took longer
    than ``step_s`` count the excess as :data:`STRAGGLER`."""

    begin: float
    end: float
    step_s: float


@dataclass(frozen=True)
class Bucket:
    name: str
    seconds: float
    share: float
    """Of the wall time, 0..1."""


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    """Wall time of the run times ``processes``: process-seconds."""
    productive_s: float
    goodput: float
    """``productive_s / wall_s`` (0 for an empty run)."""
    badput: tuple[Bucket, ...]
    """Every bucket of :data:`BADPUT`, in that order; with ``productive_s`` they sum to
    ``wall_s``."""

    processes: int = 1
    """Training processes accounted (one per rank of the job)."""

    def bucket(self, name: str) -> Bucket:
        return next(b for b in self.badput if b.name == name)


Span = tuple[float, float, str]


def _process_spans(p: Process, kept: int | None, slow: Sequence[SlowWindow] = ()) -> list[Span]:
    spans: list[Span] = []
    first = p.first_step_start
    setup_end = first if first is not None else p.end
    if p.restored_at is not None and p.restore_s > 0:
        r0 = max(p.started, p.restored_at - p.restore_s)
        spans += [(p.started, r0, PROGRAM_STARTUP), (r0, p.restored_at, CHECKPOINT_RESTORE)]
        spans.append((p.restored_at, setup_end, PROGRAM_STARTUP))
    else:
        spans.append((p.started, setup_end, PROGRAM_STARTUP))
    # The save handed over after update k blocks the loop before update k + 1.
    blocked = {c.step: c.blocked_s for c in p.checkpoints}
    prev_end: float | None = None
    prev_step: int | None = None
    for s in p.steps:
        begin = s.start if prev_end is None else prev_end
        label = PRODUCTIVE if kept is None or s.step <= kept else WASTED_PROGRESS
        wait = 0.0
        if prev_step is not None:
            wait = min(blocked.get(prev_step, 0.0), max(0.0, s.ts - begin))
        if wait > 0:
            spans.append((begin, begin + wait, CHECKPOINT_SAVE))
        window = next((w for w in slow if w.begin < s.ts <= w.end), None)
        excess = 0.0 if window is None else max(0.0, s.ts - begin - wait - window.step_s)
        spans.append((begin + wait, s.ts - excess, label))
        if excess > 0:
            spans.append((s.ts - excess, s.ts, STRAGGLER))
        prev_end, prev_step = s.ts, s.step
    if prev_end is not None and p.end > prev_end:
        # After the last update: the final save, or the save on a signal, blocks the exit.
        saved_after = p.outcome != "killed" or any(c.ts > prev_end for c in p.checkpoints)
        spans.append((prev_end, p.end, CHECKPOINT_SAVE if saved_after else OTHER))
    return spans


def _hung(out: list[Span], hung: Sequence[tuple[float, float]]) -> list[Span]:
    """``out`` with the parts of its recovery and unexplained spans that fall in a ``hung``
    window relabelled :data:`HUNG`."""
    for h0, h1 in hung:
        cut: list[Span] = []
        for begin, end, label in out:
            if label not in (INFRA_RECOVERY, OTHER) or end <= h0 or begin >= h1:
                cut.append((begin, end, label))
                continue
            a, b = max(begin, h0), min(end, h1)
            if begin < a:
                cut.append((begin, a, label))
            cut.append((a, b, HUNG))
            if b < end:
                cut.append((b, end, label))
        out = cut
    return out


def spans(
    processes: Sequence[Process],
    started: float,
    finished: float,
    hung: Sequence[tuple[float, float]] = (),
    slow: Sequence[SlowWindow] = (),
) -> list[Span]:
    """The run's time as labelled, non-overlapping spans ``(begin, end, bucket)`` covering
    ``started..finished`` exactly (gaps are labelled :data:`OTHER`). ``hung``: stalls, fault
    to every process stopped; ``slow``: while a slow node was in."""
    raw: list[Span] = []
    if processes:
        raw.append((started, processes[0].started, PROGRAM_STARTUP))
    for i, p in enumerate(processes):
        raw += _process_spans(p, kept_through(processes, i), slow)
        if i + 1 < len(processes):
            raw.append((p.end, processes[i + 1].started, INFRA_RECOVERY))
        elif p.outcome != "completed":
            # Stopped and never started again before the run ended: still recovering.
            raw.append((p.end, finished, INFRA_RECOVERY))
    # Clip to the run and to each other: a span never starts before the previous one ended
    # (clocks of different processes, or a log line written late, must not count twice).
    out: list[Span] = []
    cursor = started
    for begin, end, label in raw:
        begin, end = max(begin, cursor), min(end, finished)
        if end <= begin:
            continue
        if begin > cursor:
            out.append((cursor, begin, OTHER))
        out.append((begin, end, label))
        cursor = end
    if cursor < finished:
        out.append((cursor, finished, OTHER))
    return _hung(out, hung)


def goodput(processes: Sequence[Process], started: float, finished: float) -> Goodput:
    """Goodput and the badput buckets of the run ``started..finished`` (wall seconds)."""
    return goodput_ranks((processes,), started, finished)


def goodput_ranks(
    ranks: Sequence[Sequence[Process]],
    started: float,
    finished: float,
    hung: Sequence[tuple[float, float]] = (),
    slow: Sequence[SlowWindow] = (),
) -> Goodput:
    """Goodput and badput of a job of ``len(ranks)`` processes (each rank's runs), in
    process-seconds: each rank's spans summed (see the module docstring)."""
    wall = max(0.0, finished - started) * max(1, len(ranks))
    totals = dict.fromkeys((PRODUCTIVE, *BADPUT), 0.0)
    for processes in ranks or ((),):
        for begin, end, label in spans(processes, started, finished, hung, slow):
            totals[label] += end - begin

    def share(s: float) -> float:
        return s / wall if wall > 0 else 0.0

    return Goodput(
        wall_s=wall,
        productive_s=totals[PRODUCTIVE],
        goodput=share(totals[PRODUCTIVE]),
        badput=tuple(Bucket(name, totals[name], share(totals[name])) for name in BADPUT),
        processes=max(1, len(ranks)),
    )
