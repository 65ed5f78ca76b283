"""What one ``recover train`` invocation is asked to do, and what it did."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from recovery.errors import UsageError


class ResumeMode(StrEnum):
    """What to do with checkpoints already in the run directory."""

    never = "never"
    """Start fresh; refuse if checkpoints exist (so nothing is overwritten by mistake)."""
    required = "required"
    """Continue from the newest intact checkpoint; fail if there is none."""
    auto = "auto"
    """Continue if any checkpoint exists, else start fresh (what a requeued job wants)."""


def flag(name: str) -> str:
    """A field of the options as the ``recover train`` option: ``--eval-every``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class LongPhases:
    """Phases a real training loop legitimately spends long in, made to happen on request so
    that the job's hang watcher can be shown to sit through each one without an incident (the
    guard scenarios, docs/scenarios.md). Each presents as the real thing does: the save, the
    evaluation and the pause are announced in the progress record as a real loop announces
    them, the slow first step is not (a lazily compiling loop does not say it compiles). None
    of them touches the training math: a run with them ends with the state digest of the
    same run without them. All zero: none (the default)."""

    save_delay: float = 0.0
    """Seconds process 0 spends on top of each periodic checkpoint save, inside the save's
    ``save`` phase, as a save to slow storage does; the other processes go on to the next
    step and wait for it there (not the final save)."""
    eval_every: int = 0
    """Process 0 evaluates the loss on a held-out batch after every this many steps (not
    after the final one), in an ``evaluation`` phase, while the other processes go on to the
    next step and wait for it there. 0: never."""
    eval_seconds: float = 0.0
    """Seconds each evaluation lasts in all (at least the evaluation itself)."""
    pause_at: int = 0
    """After this step every process is ``paused`` for ``pause_seconds`` (0: no pause); a
    preemption signal ends the pause early."""
    pause_seconds: float = 0.0
    first_step_delay: float = 0.0
    """Seconds the first step of each process's run takes longer, unannounced: what a loop
    that compiles lazily, in its first step, looks like from outside."""

    def check(self, steps: int, named: Callable[[str], str] = flag) -> None:
        """Raises UsageError for values no run of ``steps`` steps can use; the message names
        each field as ``named`` writes it (default: as the option, ``--eval-every``)."""
        for name in ("save_delay", "eval_seconds", "pause_seconds", "first_step_delay"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise UsageError(f"{named(name)} must be a number of seconds >= 0 (got {value:g})")
        every, at, final = named("eval_every"), named("pause_at"), named("steps")
        if self.eval_every < 0:
            raise UsageError(f"{every} must be >= 0 (got {self.eval_every}; 0 is off)")
        if self.eval_every >= steps:
            raise UsageError(
                f"{every} {self.eval_every} never evaluates a run of {final} {steps}: "
                f"evaluations come between steps; give at most {steps - 1}"
            )
        if self.eval_seconds and not self.eval_every:
            raise UsageError(f"{named('eval_seconds')} needs {every} (how often to evaluate)")
        if self.pause_at < 0:
            raise UsageError(f"{at} must be >= 0 (got {self.pause_at}; 0 is off)")
        if self.pause_at >= steps:
            raise UsageError(
                f"{at} {self.pause_at} is not between two steps of a run of {final} {steps}; "
                f"give 1 to {steps - 1}"
            )
        if bool(self.pause_at) != bool(self.pause_seconds):
            raise UsageError(f"{at} and {named('pause_seconds')} go together; give both")


@dataclass(frozen=True)
class TrainOptions:
    """Options of one ``recover train`` invocation."""

    run_dir: Path
    """Holds events.jsonl and checkpoints/."""
    steps: int
    """Final step: the run stops after this many updates in total (not this many more)."""
    save_every: int
    """Checkpoint every this many steps (and always at the final step)."""
    resume: ResumeMode = ResumeMode.never
    seed: int = 0
    lr: float = 1e-3
    model: str = "mlp-tiny"
    keep_last: int = 3
    """Retention: newest checkpoints kept."""
    keep_every: int | None = None
    """Retention: also keep every step divisible by this."""
    async_save: bool = True
    """Write periodic checkpoints in the background (the final one is always waited for)."""
    step_sleep: float = 0.0
    """Seconds to pause after each step: stretches tiny runs for demos and fault tests."""
    compile_cache: Path | None = None
    """JAX persistent compilation cache; a restarted job skips recompiling. None: off."""
    lock_wait: float = 0.0
    """Seconds to wait for the run lock while another process holds it (an earlier run's
    process on a node that hung keeps it until the node is power-cycled); then
    RunLockedError."""
    memory_every: int = 0
    """Keep a verified copy of the state in node-local memory every this many steps (a job
    of several processes; 0: off). A relaunched job restores from a surviving node's copy
    (:mod:`recovery.api.memory`)."""
    memory_dir: Path | None = None
    """Root of the node-local copies; None: :data:`recovery.api.memory.DEFAULT_ROOT`."""
    memory_budget: float = 0.025
    """Share of the wall time the copies may take (:data:`recovery.api.memory.BUDGET`)."""
    long_phases: LongPhases = LongPhases()
    """Long phases to go through on purpose (the hang watcher's guard scenarios)."""


@dataclass(frozen=True)
class TrainOutcome:
    step: int
    """Step of the final state (== options.steps unless preempted)."""
    state_digest: str
    preempted: bool
    updates: int
    """Optimizer updates executed by this process."""


def validate(opts: TrainOptions) -> None:
    """Raises UsageError for options no run can use."""
    if opts.steps < 1:
        raise UsageError(f"--steps must be >= 1 (got {opts.steps})")
    if opts.save_every < 1:
        raise UsageError(f"--save-every must be >= 1 (got {opts.save_every})")
    if opts.step_sleep < 0:
        raise UsageError(f"--step-sleep must be >= 0 (got {opts.step_sleep})")
    if opts.memory_every < 0:
        raise UsageError(f"--memory-every must be >= 0 (got {opts.memory_every}; 0 is off)")
    if not 0 < opts.memory_budget <= 1:
        raise UsageError(
            f"--memory-budget must be a share of the time in (0, 1] (got {opts.memory_budget:g})"
        )
    if opts.lock_wait < 0:
        raise UsageError(f"--lock-wait must be >= 0 (got {opts.lock_wait})")
    opts.long_phases.check(opts.steps)
