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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

from recovery.checkpoint import AsyncCheckpointer, CheckpointStore, RetentionPolicy, RunLock
from recovery.checkpoint.store import SaveResult
from recovery.errors import (
    CheckpointError,
    CheckpointExistsError,
    StepBehindError,
    UsageError,
)
from recovery.events import EventLog, slurm_context

#: Exit status after a SIGTERM/SIGUSR1 that was handled by saving: EX_TEMPFAIL, "try again".
EXIT_PREEMPTED = 75
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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


class _Preemption:
    """Remembers the first SIGTERM/SIGUSR1; the loop checks it between steps."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum

    @contextmanager
    def installed(self) -> Iterator[_Preemption]:
        previous = {s: signal.signal(s, self.handle) for s in PREEMPT_SIGNALS}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def _validate(opts: TrainOptions) -> None:
    if opts.steps < 1:
        raise UsageError(f"--steps must be >= 1 (got {opts.steps})")
    if opts.save_every < 1:
        raise UsageError(f"--save-every must be >= 1 (got {opts.save_every})")
    if opts.step_sleep < 0:
        raise UsageError(f"--step-sleep must be >= 0 (got {opts.step_sleep})")


def run_training(
    opts: TrainOptions,
    *,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.time,
    handle_signals: bool = True,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
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
    import jax

    from recovery.train import model as M

    _validate(opts)
    if opts.compile_cache is not None:
        jax.config.update("jax_compilation_cache_dir", str(opts.compile_cache))
        # Our programs compile in well under the default 1 s threshold; cache them anyway.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
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
            mesh = M.make_mesh()
            events.emit(
                "started",
                step=None,
                target_steps=opts.steps,
                save_every=opts.save_every,
                resume=opts.resume.value,
                run_config=config,
                backend=jax.default_backend(),
                device_count=jax.device_count(),
                removed_leftovers=leftovers,
            )
            init = M.make_init(spec, mesh, opts.seed)
            template = jax.tree_util.tree_map(
                lambda leaf, sharding: jax.ShapeDtypeStruct(
                    leaf.shape, leaf.dtype, sharding=sharding
                ),
                jax.eval_shape(init),
                M.state_shardings(spec, mesh),
            )
            state, restored = _restore_or_init(opts, store, config, template, init, events, log)
            origin = f"resuming from step {restored[0]}" if restored else "starting fresh"
            log(
                f"recover: {opts.model} to step {opts.steps} on {jax.device_count()} "
                f"{jax.default_backend()} device(s), {origin}"
            )
            if restored is not None and restored[0] == opts.steps:
                # Nothing left to do: report the saved final state, run no update.
                events.emit("completed", step=restored[0], state_digest=restored[1], updates=0)
                return TrainOutcome(restored[0], restored[1], preempted=False, updates=0)
            return _train(
                opts, spec, mesh, config, store, state, restored, events, log, handle_signals
            )
        finally:
            events.close()


def _restore_or_init(
    opts: TrainOptions,
    store: CheckpointStore,
    config: dict[str, Any],
    template: Any,
    init: Callable[[], Any],
    events: EventLog,
    log: Callable[[str], None],
) -> tuple[Any, tuple[int, str] | None]:
    """``(state, (checkpoint step, its state digest))``; None for a fresh state."""
    from recovery.checkpoint import tree

    existing = store.steps()
    if opts.resume is ResumeMode.never and existing:
        raise CheckpointExistsError(
            f"{store.root} already holds checkpoints (newest step {existing[-1]}); "
            "pass --resume to continue that run, or choose another --run-dir"
        )
    if opts.resume is ResumeMode.never or (opts.resume is ResumeMode.auto and not existing):
        return init(), None
    t0 = time.perf_counter()
    result = store.restore_latest(run_config=config)
    for bad_step, reason in result.fallbacks:
        log(f"recover: checkpoint step {bad_step} failed verification ({reason}); falling back")
        aside = store.set_aside(bad_step)
        events.emit("fallback", step=bad_step, reason=reason, moved_to=aside.name)
    loaded = result.loaded
    if loaded.step > opts.steps:
        raise StepBehindError(
            f"--steps {opts.steps} is behind the newest intact checkpoint (step {loaded.step}) "
            f"in {store.root}; pass --steps {loaded.step} or more"
        )
    position = loaded.manifest.metadata.get("data_position")
    if position != loaded.step:
        raise CheckpointError(
            f"checkpoint step {loaded.step} records data position {position!r}; this "
            "trainer consumes one batch per step, so the checkpoint is not one of its own"
        )
    state = tree.from_host(template, loaded.arrays)
    # A run killed between a save and its retention left extra steps; trim them now that the
    # restored step is known to be intact (it is the newest, so it is kept).
    _, errors = store.apply_retention(newest_durable=loaded.step)
    for error in errors:
        log(f"recover: could not delete an old checkpoint ({error}); will retry later")
    events.emit(
        "restored",
        step=loaded.step,
        checkpoint_step=loaded.step,
        data_position=position,
        state_digest=loaded.state_digest,
        bytes=loaded.manifest.total_bytes,
        restore_s=round(time.perf_counter() - t0, 6),
        fallbacks=len(result.fallbacks),
    )
    return state, (loaded.step, loaded.state_digest)


def _train(
    opts: TrainOptions,
    spec: Any,
    mesh: Any,
    config: dict[str, Any],
    store: CheckpointStore,
    state: Any,
    restored: tuple[int, str] | None,
    events: EventLog,
    log: Callable[[str], None],
    handle_signals: bool,
) -> TrainOutcome:
    import jax
    import jax.numpy as jnp

    from recovery.checkpoint import tree
    from recovery.train import model as M

    batch_fn = M.make_batch_fn(spec, mesh, opts.seed)
    step_fn = M.make_train_step(spec, mesh, opts.lr)
    step = int(state["step"])

    # Warmup: compile both functions and run them once on the current state, discarding the
    # result (functional update: the state is unchanged), so step times are steady-state.
    t0 = time.perf_counter()
    probe = batch_fn(jnp.int32(step))
    jax.block_until_ready(step_fn(state, probe))
    events.emit("warmup", step=step, warmup_s=round(time.perf_counter() - t0, 6))

    # step -> state digest of what is durable on disk
    durable: dict[int, str] = dict([restored]) if restored else {}
    # step -> seconds the loop was blocked handing that save over (previous save + host copy)
    blocked: dict[int, float] = {}

    def on_saved(result: SaveResult) -> None:
        durable[result.step] = result.state_digest
        for error in result.retention_errors:
            log(f"recover: could not delete an old checkpoint ({error}); will retry later")
        events.emit(
            "checkpoint",
            step=result.step,
            checkpoint_step=result.step,
            state_digest=result.state_digest,
            bytes=result.total_bytes,
            save_s=round(result.seconds, 6),
            blocked_s=round(blocked.get(result.step, 0.0), 6),
            deleted_steps=list(result.deleted_steps),
        )

    def save(s: int, st: Any, *, wait: bool) -> None:
        t = time.perf_counter()
        ckpt.wait()  # at most one save in flight; raises if the previous one failed
        host = tree.to_host(st)
        blocked[s] = time.perf_counter() - t
        ckpt.save(s, host, run_config=config, metadata={"data_position": s})
        if wait or not opts.async_save:
            ckpt.wait()
        elif blocked[s] > 1.0:
            log(f"recover: training blocked {blocked[s]:.2f}s handing step {s} to the saver")

    preemption = _Preemption()
    updates = 0
    progress_every = max(1, opts.steps // 10)  # about ten progress lines per run
    with (
        AsyncCheckpointer(store, on_saved=on_saved) as ckpt,
        preemption.installed() if handle_signals else _nullcontext(preemption),
    ):
        while step < opts.steps and preemption.signal is None:
            t = time.perf_counter()
            state, loss = step_fn(state, batch_fn(jnp.int32(step)))
            loss_value = float(loss)  # waits for the step to finish
            step += 1
            updates += 1
            step_s = time.perf_counter() - t
            events.emit(
                "step", step=step, loss=loss_value, step_s=round(step_s, 6), data_position=step - 1
            )
            if step % progress_every == 0 or step == opts.steps:
                log(f"step {step}/{opts.steps} loss {loss_value:.4f} ({step_s * 1e3:.1f} ms/step)")
            if step % opts.save_every == 0 and step < opts.steps:
                save(step, state, wait=False)
            if opts.step_sleep:
                time.sleep(opts.step_sleep)
        ckpt.wait()
        if step not in durable:
            save(step, state, wait=True)
        digest = durable[step]
    if preemption.signal is not None and step < opts.steps:
        name = signal.Signals(preemption.signal).name
        events.emit("preempted", step=step, checkpoint_step=step, signal=name, updates=updates)
        log(f"recover: {name} received; saved step {step}, exiting with {EXIT_PREEMPTED}")
        return TrainOutcome(step, digest, preempted=True, updates=updates)
    events.emit("completed", step=step, state_digest=digest, updates=updates)
    return TrainOutcome(step, digest, preempted=False, updates=updates)


@contextmanager
def _nullcontext(value: _Preemption) -> Iterator[_Preemption]:
    yield value
