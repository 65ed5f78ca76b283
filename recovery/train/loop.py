"""The training entrypoint behind ``recover train``: resumable, deterministic, preemptible.

Run layout::

    RUN_DIR/events.jsonl          one JSON event per line (see recovery.events)
    RUN_DIR/checkpoints/step_N/   verified checkpoints (see docs/checkpoint-format.md)

A run killed at any instant and restarted with ``--resume`` continues from the newest
checkpoint that verifies and ends with exactly the state an uninterrupted run reaches.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from recovery.checkpoint import CheckpointStore, Loaded, RetentionPolicy, RunLock
from recovery.errors import (
    CheckpointError,
    CheckpointExistsError,
    StepBehindError,
    UsageError,
)
from recovery.events import EventLog, slurm_context
from recovery.train.preempt import EXIT_PREEMPTED, Preemption
from recovery.train.saving import Log, Saver, log_retention_errors
from recovery.train.workload import registered, workload_dir

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from recovery.train.model import ModelSpec

__all__ = [
    "EXIT_PREEMPTED",
    "ResumeMode",
    "TrainOptions",
    "TrainOutcome",
    "run_training",
]


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


@dataclass(frozen=True)
class TrainOutcome:
    step: int
    """Step of the final state (== options.steps unless preempted)."""
    state_digest: str
    preempted: bool
    updates: int
    """Optimizer updates executed by this process."""


def _validate(opts: TrainOptions) -> None:
    if opts.steps < 1:
        raise UsageError(f"--steps must be >= 1 (got {opts.steps})")
    if opts.save_every < 1:
        raise UsageError(f"--save-every must be >= 1 (got {opts.save_every})")
    if opts.step_sleep < 0:
        raise UsageError(f"--step-sleep must be >= 0 (got {opts.step_sleep})")


@dataclass(frozen=True)
class _Run:
    """What every phase of one training process shares, fixed once the run lock is held."""

    opts: TrainOptions
    spec: ModelSpec
    mesh: Mesh
    config: dict[str, Any]
    """The run configuration stored in (and checked against) every checkpoint."""
    store: CheckpointStore
    events: EventLog
    log: Log


class _Restored(NamedTuple):
    step: int
    digest: str
    """State digest of the checkpoint restored."""


def run_training(
    opts: TrainOptions,
    *,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.time,
    handle_signals: bool = True,
    log: Log = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> TrainOutcome:
    """Train to ``opts.steps``, resuming as ``opts.resume`` says. See the module docstring.

    Raises:
        UsageError: bad options (unknown model, non-positive steps, ...).
        CheckpointExistsError: fresh start requested but checkpoints exist.
        NoCheckpointError, AllCheckpointsDamagedError, ConfigMismatchError: on resume.
        StepBehindError: the newest checkpoint is past ``opts.steps``.
        RunLockedError: another process trains in the same run directory.
        BackgroundSaveError: a checkpoint could not be written.
    """
    from recovery.train import model as M

    _validate(opts)
    _use_compile_cache(opts.compile_cache)
    spec = M.get_spec(opts.model)
    config = M.run_config(model=opts.model, seed=opts.seed, lr=opts.lr)
    ckpt_root = opts.run_dir / "checkpoints"
    store = CheckpointStore(
        ckpt_root,
        clock=clock,
        retention=RetentionPolicy(keep_last=opts.keep_last, keep_every=opts.keep_every),
    )
    with RunLock(ckpt_root).held():
        leftovers = store.remove_leftovers()
        events = EventLog(
            opts.run_dir / "events.jsonl", context=slurm_context(environ), clock=clock
        )
        try:
            run = _Run(opts, spec, M.make_mesh(), config, store, events, log)
            return _run_locked(run, leftovers, handle_signals=handle_signals)
        finally:
            events.close()


def _use_compile_cache(directory: Path | None) -> None:
    if directory is None:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Our programs compile in well under the default 1 s threshold; cache them anyway.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _run_locked(run: _Run, leftovers: list[str], *, handle_signals: bool) -> TrainOutcome:
    """Start, restore or initialise, then train; the run lock is held and events are open."""
    import jax

    from recovery.train import model as M

    opts = run.opts
    run.events.emit(
        "started",
        step=None,
        target_steps=opts.steps,
        save_every=opts.save_every,
        resume=opts.resume.value,
        run_config=run.config,
        backend=jax.default_backend(),
        device_count=jax.device_count(),
        removed_leftovers=leftovers,
    )
    init = M.make_init(run.spec, run.mesh, opts.seed)
    template = jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        jax.eval_shape(init),
        M.state_shardings(run.spec, run.mesh),
    )
    state, restored = _restore_or_init(run, template, init)
    origin = f"resuming from step {restored.step}" if restored else "starting fresh"
    run.log(
        f"recover: {opts.model} to step {opts.steps} on {jax.device_count()} "
        f"{jax.default_backend()} device(s), {origin}"
    )
    if restored is not None and restored.step == opts.steps:
        # Nothing left to do: report the saved final state, run no update.
        run.events.emit("completed", step=restored.step, state_digest=restored.digest, updates=0)
        return TrainOutcome(restored.step, restored.digest, preempted=False, updates=0)
    with registered(jax.default_backend(), workload_dir(os.environ)):
        return _train(run, state, restored, handle_signals=handle_signals)


def _restore_or_init(
    run: _Run, template: Any, init: Callable[[], Any]
) -> tuple[Any, _Restored | None]:
    """The state to train from, and the checkpoint it came from (None for a fresh state)."""
    from recovery.checkpoint import tree

    opts, store = run.opts, run.store
    existing = store.steps()
    if opts.resume is ResumeMode.never and existing:
        raise CheckpointExistsError(
            f"{store.root} already holds checkpoints (newest step {existing[-1]}); "
            "pass --resume to continue that run, or choose another --run-dir"
        )
    if opts.resume is ResumeMode.never or (opts.resume is ResumeMode.auto and not existing):
        return init(), None
    t0 = time.perf_counter()
    result = store.restore_latest(run_config=run.config)
    for bad_step, reason in result.fallbacks:
        run.log(f"recover: checkpoint step {bad_step} failed verification ({reason}); falling back")
        aside = store.set_aside(bad_step)
        run.events.emit("fallback", step=bad_step, reason=reason, moved_to=aside.name)
    loaded = result.loaded
    position = _check_resumable(run, loaded)
    state = tree.from_host(template, loaded.arrays)
    # A run killed between a save and its retention left extra steps; trim them now that the
    # restored step is known to be intact (it is the newest, so it is kept).
    _, errors = store.apply_retention(newest_durable=loaded.step)
    log_retention_errors(run.log, errors)
    run.events.emit(
        "restored",
        step=loaded.step,
        checkpoint_step=loaded.step,
        data_position=position,
        state_digest=loaded.state_digest,
        bytes=loaded.manifest.total_bytes,
        restore_s=round(time.perf_counter() - t0, 6),
        fallbacks=len(result.fallbacks),
    )
    return state, _Restored(loaded.step, loaded.state_digest)


def _check_resumable(run: _Run, loaded: Loaded) -> object:
    """The data position ``loaded`` records; raises if this run cannot continue from it."""
    if loaded.step > run.opts.steps:
        raise StepBehindError(
            f"--steps {run.opts.steps} is behind the newest intact checkpoint "
            f"(step {loaded.step}) in {run.store.root}; pass --steps {loaded.step} or more"
        )
    position = loaded.manifest.metadata.get("data_position")
    if position != loaded.step:
        raise CheckpointError(
            f"checkpoint step {loaded.step} records data position {position!r}; this "
            "trainer consumes one batch per step, so the checkpoint is not one of its own"
        )
    return position


class _Programs(NamedTuple):
    """The compiled functions of one run."""

    step_fn: Callable[[Any, Any], tuple[Any, Any]]
    """``(state, batch) -> (state, loss)``: one optimizer update."""
    batch_fn: Callable[[Any], Any]
    """``data position -> batch``: deterministic in the seed and the position."""


def _train(
    run: _Run, state: Any, restored: _Restored | None, *, handle_signals: bool
) -> TrainOutcome:
    """Step from ``state`` to the final step or a preemption, then save and report."""
    step = int(state["step"])
    programs = _compile(run, state, step)
    preemption = Preemption()
    saver = Saver(
        run.store,
        run_config=run.config,
        events=run.events,
        log=run.log,
        async_save=run.opts.async_save,
    )
    signals: AbstractContextManager[Preemption] = (
        preemption.installed() if handle_signals else nullcontext(preemption)
    )
    with saver.checkpointer, signals:
        state, step, updates = _steps(run, state, step, programs, saver, preemption)
        digest = saver.final(step, state, restored=restored)
    if preemption.signal is not None and step < run.opts.steps:
        name = signal.Signals(preemption.signal).name
        run.events.emit("preempted", step=step, checkpoint_step=step, signal=name, updates=updates)
        run.log(f"recover: {name} received; saved step {step}, exiting with {EXIT_PREEMPTED}")
        return TrainOutcome(step, digest, preempted=True, updates=updates)
    run.events.emit("completed", step=step, state_digest=digest, updates=updates)
    return TrainOutcome(step, digest, preempted=False, updates=updates)


def _compile(run: _Run, state: Any, step: int) -> _Programs:
    """The train step and batch functions, compiled and run once on ``state``."""
    import jax
    import jax.numpy as jnp

    from recovery.train import model as M

    batch_fn = M.make_batch_fn(run.spec, run.mesh, run.opts.seed)
    step_fn = M.make_train_step(run.spec, run.mesh, run.opts.lr)
    # Warmup: compile both functions and run them once on the current state, discarding the
    # result (functional update: the state is unchanged), so step times are steady-state.
    t0 = time.perf_counter()
    jax.block_until_ready(step_fn(state, batch_fn(jnp.int32(step))))
    run.events.emit("warmup", step=step, warmup_s=round(time.perf_counter() - t0, 6))
    return _Programs(step_fn, batch_fn)


def _steps(
    run: _Run,
    state: Any,
    step: int,
    programs: _Programs,
    saver: Saver,
    preemption: Preemption,
) -> tuple[Any, int, int]:
    """Update until the final step or a preemption signal, saving every ``save_every``
    steps (not the final one: that is :meth:`Saver.final`'s). Returns
    ``(state, step, updates made)``."""
    import jax.numpy as jnp

    opts = run.opts
    updates = 0
    progress_every = max(1, opts.steps // 10)  # about ten progress lines per run
    while step < opts.steps and preemption.signal is None:
        t = time.perf_counter()
        state, loss = programs.step_fn(state, programs.batch_fn(jnp.int32(step)))
        loss_value = float(loss)  # waits for the step to finish
        step += 1
        updates += 1
        step_s = time.perf_counter() - t
        run.events.emit(
            "step", step=step, loss=loss_value, step_s=round(step_s, 6), data_position=step - 1
        )
        if step % progress_every == 0 or step == opts.steps:
            run.log(f"step {step}/{opts.steps} loss {loss_value:.4f} ({step_s * 1e3:.1f} ms/step)")
        if step % opts.save_every == 0 and step < opts.steps:
            saver.periodic(step, state)
        if opts.step_sleep:
            time.sleep(opts.step_sleep)
    return state, step, updates
