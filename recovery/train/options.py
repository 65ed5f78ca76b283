"""What one ``recover train`` invocation is asked to do, and what it did."""

from __future__ import annotations

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
