"""Is one process of a job persistently slower than its peers (a slow node: fail-slow)?
Pure: fed the processes' :class:`~recovery.progress.record.Record` s, it compares each
process's own work per step (``compute_total_s`` over ``compute_steps``: the time it spent on
its share of a step, its wait for the others left out) across the job.

In a synchronous job every process finishes each step together, so the step time says nothing
about who is slow; the work before the wait does. The rule, per look:

* each process's work per step over its last :attr:`StragglerConfig.window_steps` steps: the
  median of its means between successive looks (from the differences of its running totals:
  no step is missed between looks, and a pause of a step or two does not count);
* its ratio to the median of the others' means;
* a process whose ratio is at least :attr:`StragglerConfig.factor`, and whose excess is at
  least :attr:`StragglerConfig.min_excess_s` a step, on :attr:`StragglerConfig.persist`
  looks in a row, is the job's straggler.

The cost so far: the job waits for its slowest process every step, so each step since the
straggler was first seen slow cost about its excess over the others.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from recovery.errors import UsageError, unknown_choice
from recovery.progress.record import Phase, Record


@dataclass(frozen=True)
class StragglerConfig:
    """The straggler rule's thresholds."""

    factor: float = 1.5
    """A process this many times slower than the median of its peers is slow."""
    window_steps: int = 20
    """Steps each mean is taken over."""
    persist: int = 5
    """Looks in a row it must be slow on (a moment's hiccup is not a slow node)."""
    min_excess_s: float = 0.01
    """Seconds a step it must be slower by: a ratio of a few milliseconds is noise (a
    busy machine shares its cores unevenly), a slow node costs far more."""
    swap: bool = False
    """The job asks to be moved off its straggler when what that saves over its remaining
    steps is more than the move costs: a job that holds spares (in-allocation) is relaunched
    on one by its supervisor; any other is moved on the requeue path (the agent reports
    ``node-slow-swap``: the node drained, the job saved and requeued onto a spare). Otherwise
    (and by default) the straggler is only reported."""
    until_step: int = 0
    """The step the job trains to (0: not known, and no swap on the requeue path): what a
    swap saves is reckoned over the steps left. ``recover train`` sets it from ``--steps``."""
    swap_cost_s: float = 60.0
    """What moving the job on the requeue path costs: drained, saved, requeued, started on a
    spare and compiled again (about a minute on the local cluster). The in-allocation
    supervisor measures its own relaunches instead."""

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise UsageError(f"straggler factor must be > 1 (got {self.factor!r})")
        if self.window_steps < 2 or self.persist < 1 or self.min_excess_s < 0:
            raise UsageError(
                "straggler rule: window_steps >= 2, persist >= 1 and min_excess_s >= 0 "
                f"(got {self.window_steps}, {self.persist}, {self.min_excess_s})"
            )
        if self.until_step < 0 or self.swap_cost_s < 0:
            raise UsageError(
                "straggler rule: until_step >= 0 and swap_cost_s >= 0 "
                f"(got {self.until_step}, {self.swap_cost_s})"
            )

    def requeue_swap(self, found: Straggler) -> tuple[bool, str]:
        """Whether moving the job off ``found``'s node on the requeue path pays, and why (or
        why not) in words."""
        if not self.swap:
            return False, "the job asks for reports only (straggler.swap false)"
        left = self.until_step - found.step
        if self.until_step <= 0 or left <= 0:
            return False, "the steps left are not known (straggler.until_step)"
        gain = found.excess_s * left
        if gain <= self.swap_cost_s:
            return False, (
                f"it would save {gain:.1f} s over the {left} steps left, not more than a move "
                f"costs ({self.swap_cost_s:g} s)"
            )
        return True, (
            f"moving the job saves about {gain:.1f} s over the {left} steps left, more than "
            f"the move costs ({self.swap_cost_s:g} s)"
        )

    def overridden(self, changes: Any, where: str = "straggler") -> StragglerConfig:
        """This rule with ``changes`` (its field names). UsageError naming the valid ones for
        an unknown key or a value of the wrong kind or range."""
        if not isinstance(changes, Mapping):
            raise UsageError(f"{where}: expected a mapping of {', '.join(_FIELDS)}")
        out: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in _FIELDS:
                raise unknown_choice(f"{where}: key", key, _FIELDS)
            kind = _FIELDS[key]
            if kind is bool and not isinstance(value, bool):
                raise UsageError(f"{where}: {key}: expected true or false (got {value!r})")
            if kind is not bool and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise UsageError(f"{where}: {key}: expected a number (got {value!r})")
            if kind is int and not float(value).is_integer():
                raise UsageError(f"{where}: {key}: expected a whole number (got {value!r})")
            out[key] = kind(value)
        return replace(self, **out)


_FIELDS: dict[str, type] = {
    f.name: {"float": float, "int": int, "bool": bool}[str(f.type)] for f in fields(StragglerConfig)
}


@dataclass(frozen=True)
class Straggler:
    """A process found persistently slower than its peers."""

    rank: int
    node: str
    pid: int
    step_s: float
    """Its mean work per step over the window."""
    peers_s: float
    """The median of its peers' means."""
    since_step: int
    """The newest finished step when it was first seen slow."""
    step: int
    """The newest finished step now."""
    lost_s: float
    """Seconds the job lost to it so far: its excess a step, times the steps since."""
    job_step_s: float | None = None
    """The job's time per step now (the median over the window's looks)."""
    healthy_step_s: float | None = None
    """The job's time per step before anyone was slow (None: not seen)."""

    @property
    def slowdown(self) -> float:
        return self.step_s / self.peers_s if self.peers_s > 0 else float("inf")

    @property
    def excess_s(self) -> float:
        """What the job loses to it a step: its own work's excess over its peers', or, when
        more, the job's step time over its healthy one (a throttled process is slow at more
        than its timed share: the update after the exchange, its batches)."""
        own = max(0.0, self.step_s - self.peers_s)
        if self.job_step_s is None or self.healthy_step_s is None:
            return own
        return max(own, self.job_step_s - self.healthy_step_s)

    def describe(self) -> str:
        return (
            f"rank {self.rank} on {self.node or '?'} does its share of a step in "
            f"{self.step_s:.3f} s against {self.peers_s:.3f} s for its peers "
            f"({self.slowdown:.1f}x, since step {self.since_step})"
            + (
                f"; the job's step takes {self.job_step_s:.3f} s against "
                f"{self.healthy_step_s:.3f} s before"
                if self.job_step_s is not None and self.healthy_step_s is not None
                else ""
            )
            + f"; the job has lost about {self.lost_s:.1f} s to it so far"
        )


class StragglerWatch:
    """Follows one launch of a job (its processes' records, look after look)."""

    def __init__(self, config: StragglerConfig | None = None) -> None:
        self.config = config or StragglerConfig()
        self._history: dict[int, deque[tuple[int, float]]] = {}
        self._slow: dict[int, tuple[int, int]] = {}
        """Per rank seen slow: (looks in a row, the newest step when first seen)."""
        self._healthy: deque[tuple[int, float]] = deque(maxlen=4 * self.config.window_steps)
        """(step, the job's time per step) on looks when no process was slow."""
        self._recent: deque[float] = deque(maxlen=max(2, self.config.window_steps // 4))
        """The job's time per step on the latest looks."""
        self._newest = -1

    def means(self, records: Mapping[int, Record]) -> dict[int, float]:
        """Each process's work per step over the window, for those that have a full window
        (after recording this look): the median of its means between successive looks, so
        that a pause of a step or two (a collection, a page fault storm) does not count."""
        out = {}
        for rank, rec in records.items():
            hist = self._history.setdefault(rank, deque())
            if not hist or hist[-1][0] != rec.compute_steps:
                hist.append((rec.compute_steps, rec.compute_total_s))
            # Keep no more than a window behind the newest look.
            while len(hist) > 2 and hist[-1][0] - hist[1][0] >= self.config.window_steps:
                hist.popleft()
            if hist[-1][0] - hist[0][0] < self.config.window_steps:
                continue
            pairs = list(zip(hist, list(hist)[1:], strict=False))
            out[rank] = statistics.median((t1 - t0) / (n1 - n0) for (n0, t0), (n1, t1) in pairs)
        return out

    def observe(self, records: Mapping[int, Record]) -> Straggler | None:
        """The job's straggler after this look at its records (by rank), if there is one."""
        live = {r: rec for r, rec in records.items() if rec.phase is not Phase.done}
        means = self.means(live)
        step = max((rec.step_finished for rec in live.values()), default=-1)
        if step > self._newest:
            # Every process's step ends together (each waits for the others): the least
            # time per step among them is the job's, a phase one of them announced left out.
            times = [rec.last_step_s for rec in live.values() if rec.last_step_s > 0]
            if times:
                self._recent.append(min(times))
                if not self._slow:
                    self._healthy.append((step, min(times)))
            self._newest = step
        if len(means) < 2:
            self._slow.clear()
            return None
        job_step = statistics.median(self._recent) if self._recent else None
        found: list[Straggler] = []
        for rank, mean in means.items():
            peers = statistics.median(m for r, m in means.items() if r != rank)
            slow = (
                peers > 0
                and mean >= self.config.factor * peers
                and mean - peers >= self.config.min_excess_s
            )
            if not slow:
                self._slow.pop(rank, None)
                continue
            looks, since = self._slow.get(rank, (0, step))
            self._slow[rank] = (looks + 1, since)
            if looks + 1 >= self.config.persist:
                rec = live[rank]
                # It is seen slow within a window of going slow: the step times of the
                # looks before that are healthy for sure (the ones after may not be).
                before = [t for n, t in self._healthy if n <= since - self.config.window_steps]
                healthy = statistics.median(before) if before else None
                slow_one = Straggler(
                    rank, rec.node, rec.pid, mean, peers, since, step, 0.0, job_step, healthy
                )
                lost = slow_one.excess_s * max(0, step - since + self.config.window_steps)
                found.append(replace(slow_one, lost_s=lost))
        # Several at once (a slow rack): the slowest first; the others are in its shadow.
        return max(found, key=lambda s: s.slowdown, default=None)
