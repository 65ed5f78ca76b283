"""The training job's event log cut into processes: one per ``started`` event.

A requeued job runs the trainer again; each run of it begins with ``started`` and ends with
its last event (``completed``, ``preempted``, or nothing at all when it was killed). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recovery.report.run import Event


@dataclass(frozen=True)
class Step:
    """One optimizer update: it ran from ``start`` to ``ts`` (wall seconds)."""

    step: int
    ts: float
    start: float


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint that became durable at ``ts``."""

    step: int
    ts: float
    blocked_s: float
    """Seconds the loop was blocked handing this save to the background saver."""
    save_s: float


@dataclass(frozen=True)
class Fallback:
    """A newer checkpoint that failed verification and was set aside on restore."""

    step: int
    reason: str
    moved_to: str


@dataclass(frozen=True)
class Process:
    """One run of the trainer (one ``started`` to its last event)."""

    index: int
    started: float
    end: float
    """Wall seconds of its last event."""
    node: str | None
    restart_count: int | None
    restored_step: int | None
    """Step of the checkpoint it restored; None when it started fresh."""
    restored_at: float | None
    restore_s: float
    """Seconds spent restoring and verifying (the ``restored`` event's own measure)."""
    fallbacks: tuple[Fallback, ...]
    steps: tuple[Step, ...]
    checkpoints: tuple[Checkpoint, ...]
    outcome: str
    """``completed``, ``preempted`` (saved on a signal), or ``killed`` (no final event)."""
    final_step: int | None
    """The step its ``completed`` or ``preempted`` event reports."""
    last_event: str = ""
    """The kind of its last event (``peer-lost``: it stopped because another process of the
    job was lost)."""

    @property
    def first_step_start(self) -> float | None:
        return self.steps[0].start if self.steps else None

    @property
    def last_step(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def step_at(self, step: int) -> Step | None:
        """This process's update that reached ``step``, or None."""
        return next((s for s in self.steps if s.step == step), None)

    def first_beyond(self, step: int) -> Step | None:
        """Its first update past ``step``, or None."""
        return next((s for s in self.steps if s.step > step), None)


def _float(e: Event, key: str) -> float:
    value = e.data.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _process(index: int, events: Sequence[Event]) -> Process:
    head = events[0]
    restored = next((e for e in events if e.kind == "restored"), None)
    final = next((e for e in reversed(events) if e.kind in ("completed", "preempted")), None)
    steps: list[Step] = []
    for e in events:
        if e.kind != "step" or e.step is None:
            continue
        # An update began when its own timer started; never before the previous one ended.
        start = e.ts - _float(e, "step_s")
        if steps:
            start = max(start, steps[-1].ts)
        steps.append(Step(e.step, e.ts, start))
    restart = head.data.get("restart_count")
    node = head.data.get("node")
    started = next((e.ts for e in events if e.kind == "started"), head.ts)
    return Process(
        index=index,
        started=started,
        end=max(e.ts for e in events),
        node=node if isinstance(node, str) else None,
        restart_count=restart if isinstance(restart, int) else None,
        restored_step=restored.step if restored else None,
        restored_at=restored.ts if restored else None,
        restore_s=_float(restored, "restore_s") if restored else 0.0,
        fallbacks=tuple(
            Fallback(e.step or 0, str(e.data.get("reason", "")), str(e.data.get("moved_to", "")))
            for e in events
            if e.kind == "fallback"
        ),
        steps=tuple(steps),
        checkpoints=tuple(
            Checkpoint(e.step or 0, e.ts, _float(e, "blocked_s"), _float(e, "save_s"))
            for e in events
            if e.kind == "checkpoint"
        ),
        outcome=final.kind if final else "killed",
        final_step=final.step if final else None,
        last_event=max(events, key=lambda e: e.ts).kind,
    )


def split_processes(events: Sequence[Event]) -> list[Process]:
    """The processes of the job, in order. A process begins at ``started``, or earlier at a
    line with another pid than the lines before (a process of a K-process job writes
    ``joined`` before ``started``). Lines before the first ``started`` (a log whose head was
    lost) form a process of their own beginning at its first line."""
    groups: list[list[Event]] = []
    pid: object = None  # of the lines so far (a line without one keeps it)
    for e in events:
        new_pid = e.data.get("pid")
        other = new_pid is not None and pid is not None and new_pid != pid
        seen = bool(groups) and any(x.kind == "started" for x in groups[-1])
        again = e.kind == "started" and seen
        if not groups or other or again:
            groups.append([])
        groups[-1].append(e)
        pid = new_pid if new_pid is not None else pid
    return [_process(i, g) for i, g in enumerate(groups)]


def kept_through(processes: Sequence[Process], index: int) -> int | None:
    """The highest step of process ``index`` whose update survives into the final state: an
    update past the checkpoint a later process restored from was thrown away and redone.
    None when nothing later restored (every update of the process is kept)."""
    later = [p.restored_step if p.restored_step is not None else 0 for p in processes[index + 1 :]]
    return min(later) if later else None
