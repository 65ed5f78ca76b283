"""Is a job still making progress, and if not, which process holds it up? Pure: fed the
processes' :class:`~recovery.progress.record.Record` s and the time, it learns the job's step
cadence and answers with a :class:`Verdict`.

The rule: a job is *stalled* when every process that has not ended is past its deadline. A
process in the step loop has ``max(floor, factor x p99 of the job's recent time per step)``
from its last finished step (before its first, the start-up budget: the first step of a
loop that compiles lazily compiles); one in an announced phase (start-up,
restore, save, evaluation, data) has that phase's budget from entering it; a paused one has no
deadline. So a long save or evaluation on one process holds off a verdict for the others that
wait for it, and a job that reports nothing is never judged.

Who is to blame, when stalled (:func:`attribute`):

* **frozen**: processes whose own liveness thread went quiet (stopped whole: SIGSTOP, the
  freezer cgroup, a stuck driver call) while another's still runs;
* **behind**: processes that did not reach the step (or leave the phase) the others are in
  and wait at: a main thread stuck in a system call, a data loader, a lost collective;
* otherwise nobody is named, and the verdict says why: every process is at the same point,
  and progress alone cannot tell which one the others wait for.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from recovery.errors import UsageError, unknown_choice
from recovery.progress.record import PHASES, Phase, Record
from recovery.progress.straggler import StragglerConfig

#: Seconds a step loop may always go without a finished step.
FLOOR_S = 5.0
#: ... or this many times the p99 of the job's recent time per step, when longer.
FACTOR = 10.0
#: Steps seen before the learned budget applies; until then :data:`UNLEARNED_S` does.
LEARN_AFTER = 5
UNLEARNED_S = 60.0
#: Seconds an announced phase may take unless the loop said otherwise when entering it.
PHASE_BUDGETS_S: Mapping[Phase, float] = MappingProxyType(
    {
        Phase.startup: 900.0,
        Phase.restore: 900.0,
        Phase.save: 900.0,
        Phase.evaluation: 3600.0,
        Phase.data: 900.0,
        Phase.paused: math.inf,
    }
)
#: A process whose liveness thread has not written for this long is frozen.
FROZEN_AFTER_S = 5.0
#: Recent per-step times kept for the p99.
WINDOW = 200
#: A job's own thresholds, beside its records (:func:`write_job_budgets`).
BUDGETS_FILE = "budgets.json"
#: The keys a job may set there (``phases_s``: seconds by phase name).
BUDGET_KEYS = (
    "floor_s",
    "factor",
    "learn_after",
    "unlearned_s",
    "frozen_after_s",
    "phases_s",
    "straggler",
)


@dataclass(frozen=True)
class Budgets:
    """The watcher's thresholds (every one overridable per job and in the policy)."""

    floor_s: float = FLOOR_S
    factor: float = FACTOR
    learn_after: int = LEARN_AFTER
    unlearned_s: float = UNLEARNED_S
    phases_s: Mapping[Phase, float] = field(default_factory=lambda: PHASE_BUDGETS_S)
    frozen_after_s: float = FROZEN_AFTER_S
    window: int = WINDOW
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    """The slow-process rule (:mod:`recovery.progress.straggler`), read from the same file."""

    def __post_init__(self) -> None:
        for name in ("floor_s", "factor", "unlearned_s", "frozen_after_s"):
            value = getattr(self, name)
            if not value > 0:
                raise UsageError(f"stall budget {name} must be > 0 (got {value!r})")
        if self.learn_after < 1 or self.window < self.learn_after:
            raise UsageError(
                f"stall budgets: learn_after must be >= 1 and window >= learn_after "
                f"(got {self.learn_after} and {self.window})"
            )

    def overridden(self, changes: Mapping[str, Any], where: str = "stall budgets") -> Budgets:
        """These budgets with ``changes`` (keys of :data:`BUDGET_KEYS`; ``phases_s`` maps
        phase names to seconds and is merged into the phases' budgets). UsageError, naming
        ``where`` and what is valid, for an unknown key, phase or a value out of range."""
        if not isinstance(changes, Mapping):
            raise UsageError(f"{where}: expected a mapping of {', '.join(BUDGET_KEYS)}")
        out: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in BUDGET_KEYS:
                raise unknown_choice(f"{where}: key", key, BUDGET_KEYS)
            if key == "phases_s":
                out[key] = MappingProxyType({**self.phases_s, **_phases(value, where)})
            elif key == "straggler":
                out[key] = self.straggler.overridden(value, f"{where}: straggler")
            elif key == "learn_after":
                out[key] = _number(value, f"{where}: {key}", integer=True)
            else:
                out[key] = _number(value, f"{where}: {key}")
        return replace(self, **out)

    def phase_s(self, record: Record) -> float:
        if record.phase_budget_s > 0:
            return record.phase_budget_s
        return self.phases_s.get(record.phase, self.unlearned_s)


def _number(value: Any, where: str, *, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{where}: expected a number (got {value!r})")
    if integer and not float(value).is_integer():
        raise UsageError(f"{where}: expected a whole number (got {value!r})")
    return int(value) if integer else float(value)


def _phases(value: Any, where: str) -> dict[Phase, float]:
    if not isinstance(value, Mapping):
        raise UsageError(f"{where}: phases_s: expected phase: seconds (got {value!r})")
    out = {}
    for name, seconds in value.items():
        if name not in PHASES or name in ("steps", "done"):
            valid = [n for n in PHASES if n not in ("steps", "done")]
            raise unknown_choice(f"{where}: phases_s: phase", name, valid)
        budget = _number(seconds, f"{where}: phases_s: {name}")
        if not budget > 0:
            raise UsageError(f"{where}: phases_s: {name} must be > 0 seconds (got {seconds!r})")
        out[PHASES[name]] = budget
    return out


def write_job_budgets(directory: Path, changes: Mapping[str, Any]) -> Budgets:
    """Keep a job's own thresholds beside its records, for every watcher (the node agents,
    the job's supervisor) to judge it by; the budgets they give. Checked first (UsageError
    naming what is wrong); written whole beside the file and renamed into place."""
    budgets = Budgets().overridden(changes)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / BUDGETS_FILE
    tmp = path.with_name(f".{BUDGETS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(changes), sort_keys=True) + "\n")
    os.replace(tmp, path)
    return budgets


def job_budgets(directory: Path, base: Budgets) -> tuple[Budgets, str | None]:
    """``base`` with the job's own thresholds (:func:`write_job_budgets`) over it, and why
    they were not taken when the file is there but cannot be (None otherwise)."""
    path = directory / BUDGETS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return base, None
    except OSError as e:
        return base, f"cannot read {path}: {e}"
    try:
        return base.overridden(json.loads(text), str(path)), None
    except (ValueError, UsageError) as e:
        return base, f"{path}: {e}; judged by the defaults"


@dataclass(frozen=True)
class Culprit:
    rank: int
    node: str
    pid: int
    why: str


@dataclass(frozen=True)
class Verdict:
    """What the watcher concludes at one moment."""

    state: str
    """``unwatched`` (no process reports progress), ``running``, ``stalled`` or ``done``."""
    why: str
    idle_s: float = 0.0
    """Seconds since the job last made progress (a finished step or a phase change)."""
    budget_s: float = 0.0
    """The step loop's budget now (learned or not)."""
    step: int = -1
    """The newest step any process finished."""
    culprits: tuple[Culprit, ...] = ()
    confident: bool = False
    """True when the culprits are known from what they did; never act on a guess."""

    @property
    def stalled(self) -> bool:
        return self.state == "stalled"


class StallWatch:
    """Learns one job's cadence from successive looks at its processes' records."""

    def __init__(self, budgets: Budgets | None = None) -> None:
        self.budgets = budgets or Budgets()
        self._per_step: deque[float] = deque(maxlen=self.budgets.window)
        self._newest = -1  # the newest finished step the looks saw

    def step_budget_s(self) -> float:
        """What a step loop may go without a finished step now."""
        b = self.budgets
        if len(self._per_step) < b.learn_after:
            return b.unlearned_s
        return max(b.floor_s, b.factor * _p99(self._per_step))

    def observe(self, records: Mapping[int, Record], now: float) -> Verdict:
        """Judge the job from its processes' latest records (by rank) at ``now``."""
        live = {r: rec for r, rec in records.items() if rec.phase is not Phase.done}
        if records and not live:
            return Verdict("done", "every process ended cleanly", step=_newest(records))
        if not live:
            return Verdict("unwatched", "no process of the job reports its progress")
        self._learn(live)
        budget = self.step_budget_s()
        deadlines = {r: self._deadline(rec, budget) for r, rec in live.items()}
        last_progress = max(_progress_at(rec) for rec in live.values())
        idle = max(0.0, now - last_progress)
        step = _newest(records)
        if any(now <= d for d in deadlines.values()):
            return Verdict("running", "progressing", idle, budget, step)
        culprits, confident, why = attribute(live, now, self.budgets)
        return Verdict("stalled", why, idle, budget, step, tuple(culprits), confident)

    def _deadline(self, rec: Record, budget: float) -> float:
        if rec.phase is Phase.steps and rec.step_finished < 0:
            # No step finished yet in this process: the first one compiles (a loop that
            # compiles lazily); it has the start-up budget.
            return rec.phase_since + self.budgets.phases_s.get(Phase.startup, budget)
        if rec.phase is Phase.steps:
            return max(rec.step_finished_at, rec.phase_since) + budget
        return rec.phase_since + self.budgets.phase_s(rec)

    def _learn(self, live: Mapping[int, Record]) -> None:
        """One sample per look that finds the job's newest finished step moved: the least
        time per step among the processes at (or one behind) that step. Each process's own
        announced phases are left out of its time already; a process that waited in the loop
        for a peer's long save or evaluation counts that wait, and the peer does not: the
        least is the job's own cadence."""
        newest = max(rec.step_finished for rec in live.values())
        if newest > self._newest:
            recent = [
                rec.last_step_s
                for rec in live.values()
                if rec.step_finished >= newest - 1 and rec.last_step_s > 0
            ]
            # A step that took longer than the budget was a stall that ended by itself (an
            # unannounced wait the watchers judged, or would have): not the job's cadence.
            # Learnt, one such gap would raise the p99, and the budget tenfold with it.
            if recent and min(recent) <= self.step_budget_s():
                self._per_step.append(min(recent))
        self._newest = max(self._newest, newest)


def attribute(
    live: Mapping[int, Record], now: float, budgets: Budgets
) -> tuple[list[Culprit], bool, str]:
    """Who holds a stalled job up: (culprits, confident, why). See the module docstring."""
    frozen = {r: rec for r, rec in live.items() if now - rec.alive_at > budgets.frozen_after_s}
    if len(live) == 1:
        (rec,) = live.values()
        if frozen:
            how = f"frozen: its process has not run for {now - rec.alive_at:.1f} s"
        elif rec.phase is not Phase.steps:
            how = f"stuck in its {rec.phase.name} phase for {now - rec.phase_since:.1f} s"
        elif rec.in_step:
            how = f"stuck in step {rec.step_started}"
        else:
            how = f"stuck after step {rec.step_finished}"
        return (
            [_culprit(rec, how)],
            True,
            f"its only process: rank {rec.rank} on {rec.node or '?'}, {how}",
        )
    if frozen and len(frozen) < len(live):
        out = [
            _culprit(rec, f"frozen: its process has not run for {now - rec.alive_at:.1f} s")
            for rec in frozen.values()
        ]
        return out, True, _named("frozen", out)
    if frozen:
        quiet = min(now - r.alive_at for r in live.values())
        why = f"every process has been silent for {quiet:.1f} s: their nodes or the shared "
        return [], False, why + "storage may be gone; no one process is to blame"
    in_phase = {r: rec for r, rec in live.items() if rec.phase is not Phase.steps}
    if in_phase and len(in_phase) < len(live):
        out = [
            _culprit(
                rec,
                f"in its {rec.phase.name} phase for {now - rec.phase_since:.1f} s "
                f"(budget {budgets.phase_s(rec):g} s) while the others wait",
            )
            for rec in in_phase.values()
        ]
        return out, True, _named("over its phase's budget", out)
    front = max(rec.step_started for rec in live.values())
    behind = {r: rec for r, rec in live.items() if rec.step_started < front}
    if behind:
        out = [
            _culprit(
                rec,
                f"did not enter step {front}, which the others wait in; its last finished "
                f"step is {rec.step_finished}",
            )
            for rec in behind.values()
        ]
        return out, True, _named("behind", out)
    where = (
        f"in step {front}"
        if any(rec.in_step for rec in live.values())
        else f"after step {max(rec.step_finished for rec in live.values())}"
    )
    if in_phase:
        phases = ", ".join(sorted({rec.phase.name for rec in in_phase.values()}))
        where = f"in its {phases} phase"
    return (
        [],
        False,
        (f"every process is {where}: progress alone cannot tell which one the others wait for"),
    )


def _culprit(rec: Record, why: str) -> Culprit:
    return Culprit(rec.rank, rec.node, rec.pid, why)


def _named(kind: str, culprits: list[Culprit]) -> str:
    names = ", ".join(f"rank {c.rank} on {c.node or '?'}" for c in culprits)
    return f"{kind}: {names}"


def _progress_at(rec: Record) -> float:
    return max(rec.step_finished_at, rec.phase_since)


def _newest(records: Mapping[int, Record]) -> int:
    return max((rec.step_finished for rec in records.values()), default=-1)


def _p99(values: deque[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
