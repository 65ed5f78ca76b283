"""The training entrypoint behind ``recover train``: resumable, deterministic, preemptible.

Run layout::

    RUN_DIR/events.jsonl          one JSON event per line (see recovery.events); with several
                                  processes, process r>0 writes events.rank<r>.jsonl
    RUN_DIR/checkpoints/step_N/   verified checkpoints (see docs/checkpoint-format.md)

A run killed at any instant and restarted with ``--resume`` continues from the newest
checkpoint that verifies and ends with exactly the state an uninterrupted run reaches. The
same holds for a job of K processes (data parallel, state replicated), against an
uninterrupted K-process run: see :mod:`recovery.api.ranks`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, NamedTuple

from recovery.api.manager import CheckpointManager
from recovery.api.memory import (
    DEFAULT_ROOT,
    MemoryTier,
    environ_node_key,
    local_dir,
    private_root,
    read_run_id,
    run_id,
)
from recovery.api.preemption import Preemption
from recovery.api.processes import Processes
from recovery.api.progress import open_progress
from recovery.api.ranks import Log, StopVote, failing_together, finish, start
from recovery.contract.exits import EXIT_PREEMPTED
from recovery.contract.workload import registered, workload_dir
from recovery.errors import UsageError
from recovery.events import EventLog, events_file, slurm_context
from recovery.multiproc import Topology, topology_from_env
from recovery.progress import Phase, ProgressWriter
from recovery.train import compile_cache, long_phases
from recovery.train.options import ResumeMode, TrainOptions, TrainOutcome, validate
from recovery.train.restore import restore_or_init
from recovery.train.run import Run

if TYPE_CHECKING:
    from recovery.train.model import ModelSpec

__all__ = [
    "EXIT_PREEMPTED",
    "ResumeMode",
    "TrainOptions",
    "TrainOutcome",
    "run_training",
]


def run_training(
    opts: TrainOptions,
    *,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.time,
    handle_signals: bool = True,
    log: Log = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> TrainOutcome:
    """Train to ``opts.steps``, resuming as ``opts.resume`` says. See the module docstring.

    Under a launcher that starts several processes (``srun``; see
    :func:`recovery.multiproc.topology_from_env`) every process calls this; they join,
    train data parallel, save and restore together, and stop after the same step.

    Raises:
        UsageError: bad options (unknown model, non-positive steps, a batch that does not
            divide over the processes, a multi-process launch without a rendezvous, ...).
        CheckpointExistsError: fresh start requested but checkpoints exist.
        NoCheckpointError, AllCheckpointsDamagedError, ConfigMismatchError: on resume;
            NoAgreedCheckpointError when several processes find no step all of them verify.
        StepBehindError: the newest checkpoint is past ``opts.steps``.
        RunLockedError: another process trains in the same run directory.
        BackgroundSaveError: a checkpoint could not be written.
        GroupError, PeerLostError: the processes could not join, or one was lost (a lost
            peer normally ends this process at once, with status 76, before anything raises).
    """
    validate(opts)
    topology = topology_from_env(environ)
    preemption = Preemption()
    signals: AbstractContextManager[Preemption] = (
        preemption.installed() if handle_signals else nullcontext(preemption)
    )
    with signals:  # first: a signal during the (long) start-up still asks for a save
        return _run(opts, topology, preemption, environ, clock, log)


def _run(
    opts: TrainOptions,
    topology: Topology,
    preemption: Preemption,
    environ: Mapping[str, str],
    clock: Callable[[], float],
    log: Log,
) -> TrainOutcome:
    from recovery.train import model as M

    compile_cache.use(opts.compile_cache)
    spec = M.get_spec(opts.model)
    config = M.run_config(model=opts.model, seed=opts.seed, lr=opts.lr)
    if spec.batch_size % topology.size:  # known before joining; devices are checked later
        fits = sorted(n for n, s in M.MODELS.items() if s.batch_size % topology.size == 0)
        raise UsageError(
            f"model {opts.model}'s batch of {spec.batch_size} does not divide over "
            f"{topology.size} processes; models whose batch does: {', '.join(fits) or 'none'}"
        )
    # Nothing is written before the options are known good; then the progress record, in its
    # start-up phase, for the node's agent to watch.
    progress = open_progress(opts.run_dir, environ=environ, until_step=opts.steps)
    ended = False
    try:
        if topology.multi:
            outcome = _run_multi(
                opts, topology, spec, config, preemption, environ, clock, log, progress
            )
        else:
            outcome = _run_single(opts, spec, config, preemption, environ, clock, log, progress)
        ended = True
        return outcome
    finally:
        progress.close(done=ended)


def _run_single(
    opts: TrainOptions,
    spec: ModelSpec,
    config: dict[str, Any],
    preemption: Preemption,
    environ: Mapping[str, str],
    clock: Callable[[], float],
    log: Log,
    progress: ProgressWriter,
) -> TrainOutcome:
    """One process alone: the run lock, then :func:`_run_locked`."""
    from recovery.train import model as M

    events = EventLog(events_file(opts.run_dir), context=slurm_context(environ), clock=clock)
    try:
        with _manager(opts, config, events, clock, log) as manager:
            leftovers = manager.open()  # the run lock, before the run announces itself
            run = Run(
                opts, spec, M.make_mesh(), config, manager, events, log, preemption,
                environ=environ, progress=progress,
            )  # fmt: skip
            return _run_locked(run, leftovers)
    finally:
        events.close()


def _manager(
    opts: TrainOptions,
    config: dict[str, Any],
    events: EventLog,
    clock: Callable[[], float],
    log: Log,
    processes: Processes | None = None,
) -> CheckpointManager:
    """The run's checkpoints, through the library users' loops use (:mod:`recovery.api`)."""
    return CheckpointManager(
        opts.run_dir / "checkpoints",
        run_config=config,
        keep_last=opts.keep_last,
        keep_every=opts.keep_every,
        async_save=opts.async_save,
        events=events,
        clock=clock,
        processes=processes,
        log=log,
        lock_wait=opts.lock_wait,
    )


def _run_multi(
    opts: TrainOptions,
    topology: Topology,
    spec: ModelSpec,
    config: dict[str, Any],
    preemption: Preemption,
    environ: Mapping[str, str],
    clock: Callable[[], float],
    log: Log,
    progress: ProgressWriter,
) -> TrainOutcome:
    """One process of several: join, then as :func:`run_training` with process 0 holding the
    run lock and clearing leftovers before anyone writes, then end together."""
    from recovery.train import model as M

    context = {**slurm_context(environ), "rank": topology.rank, "ranks": topology.size}
    events = EventLog(events_file(opts.run_dir, topology.rank), context=context, clock=clock)
    try:
        ranks = start(topology, events, log, environ=dict(environ))
        with failing_together(ranks):
            lead = topology.rank == 0
            processes = Processes(ranks, topology)
            with _manager(opts, config, events, clock, log, processes) as manager:
                # process 0 takes the lock and clears leftovers; nobody writes before that
                leftovers = manager.open()
                if lead and opts.memory_every:  # the copies' run id, before anyone reads it
                    fresh = opts.resume is ResumeMode.never and not manager.steps()
                    run_id(opts.run_dir, fresh=fresh)
                ranks.group.barrier()
                mesh = M.make_mesh(topology.size)
                memory = _memory_tier(opts, config, topology, environ, log)
                run = Run(
                    opts,
                    spec,
                    mesh,
                    config,
                    manager,
                    events,
                    log,
                    preemption,
                    ranks,
                    memory,
                    environ=environ,
                    progress=progress,
                )
                with compile_cache.every_process_writes(topology.size):
                    outcome = _run_locked(run, leftovers)
                finish(ranks, EXIT_PREEMPTED if outcome.preempted else 0, log)
                return outcome
    finally:
        events.close()


def _memory_tier(
    opts: TrainOptions,
    config: dict[str, Any],
    topology: Topology,
    environ: Mapping[str, str],
    log: Log,
) -> MemoryTier | None:
    """This process's node-local copies, when ``--memory-every`` asks for them."""
    if not opts.memory_every:
        return None
    root = private_root(opts.memory_dir or DEFAULT_ROOT)
    directory = local_dir(root, environ_node_key(environ), opts.run_dir, read_run_id(opts.run_dir))

    def failed(error: BaseException) -> None:
        log(f"recover: could not keep a copy in {directory} ({error}); the next step tries again")

    return MemoryTier(
        directory,
        every=opts.memory_every,
        budget=opts.memory_budget,
        run_config=config,
        processes=topology.size,
        on_error=failed,
    )


def _run_locked(run: Run, leftovers: list[str]) -> TrainOutcome:
    """Start, restore or initialise, then train; the run lock is held and events are open."""
    import jax

    from recovery.train import model as M

    opts = run.opts
    M.batch_sharding(run.spec, run.mesh)  # a batch that does not divide: refuse before work
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
    with run.phase(Phase.restore):
        state, restored = restore_or_init(run, template, init)
    origin = f"resuming from step {restored.step}" if restored else "starting fresh"
    where = "" if run.ranks is None else f" (process {run.ranks.rank} of {run.ranks.size})"
    run.log(
        f"recover: {opts.model} to step {opts.steps} on {jax.device_count()} "
        f"{jax.default_backend()} device(s){where}, {origin}"
    )
    if restored is not None and restored.step == opts.steps:
        # Nothing left to do: report the saved final state, run no update.
        run.events.emit("completed", step=restored.step, state_digest=restored.digest, updates=0)
        return TrainOutcome(restored.step, restored.digest, preempted=False, updates=0)
    with registered(jax.default_backend(), workload_dir(run.environ)):
        return _train(run, state)


class _Programs(NamedTuple):
    """The compiled functions of one run."""

    step_fn: Callable[[Any, Any], tuple[Any, Any, float | None]]
    """``(state, batch) -> (state, loss, seconds of this process's own work)``: one optimizer
    update; the work is timed apart from the wait for the peers with several processes
    (:mod:`recovery.train.split_step`), None with one."""
    batch_fn: Callable[[Any], Any]
    """``data position -> batch``: deterministic in the seed and the position."""
    position: Callable[[int], Any]
    """A step number as the batch function's argument."""


def _train(run: Run, state: Any) -> TrainOutcome:
    """Step from ``state`` to the final step or a preemption, then save and report."""
    step = int(state["step"])
    programs = _compile(run, state, step)
    state, step, updates, stopped_by = _steps(run, state, step, programs)
    with run.phase(Phase.save):
        digest = run.manager.finalize(step, state, metadata={"data_position": step})
    if stopped_by is not None and step < run.opts.steps:
        name = signal.Signals(stopped_by).name
        run.events.emit("preempted", step=step, checkpoint_step=step, signal=name, updates=updates)
        run.log(f"recover: {name} received; saved step {step}, exiting with {EXIT_PREEMPTED}")
        return TrainOutcome(step, digest, preempted=True, updates=updates)
    tier: dict[str, Any] = {}
    if run.memory is not None:
        run.memory.discard()  # complete and durable: no relaunch will want the copies
        tier = {"memory_copies": run.memory.copies, "memory_s": round(run.memory.spent_s, 6)}
    run.events.emit("completed", step=step, state_digest=digest, updates=updates, **tier)
    return TrainOutcome(step, digest, preempted=False, updates=updates)


def _compile(run: Run, state: Any, step: int) -> _Programs:
    """The train step and batch functions, compiled and run once on ``state``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from recovery.train import model as M
    from recovery.train import split_step as S

    batch_fn = M.make_batch_fn(run.spec, run.mesh, run.opts.seed)
    # Several processes: a host scalar every process passes alike (a single process keeps the
    # device scalar it always used).
    position: Callable[[int], Any] = jnp.int32 if run.ranks is None else np.int32
    # Warmup: compile both functions and run them once on the current state, discarding the
    # result (functional update: the state is unchanged), so step times are steady-state.
    t0 = time.perf_counter()
    step_fn: Callable[[Any, Any], tuple[Any, Any, float | None]]
    if run.ranks is None:
        one = M.make_train_step(run.spec, run.mesh, run.opts.lr)
        step_fn = lambda state, batch: (*one(state, batch), None)  # noqa: E731
    else:
        split = S.make_split_step(run.spec, run.mesh, run.opts.lr)
        # The first collective sets up gloo, whose key exchange waits only 30 s for the
        # peers; compiling on a busy node can take longer. Compile first, then meet.
        S.compile_ahead(split, batch_fn, state, position(step))
        run.ranks.group.barrier()
        step_fn = S.timed_step(split, time.perf_counter)
    jax.block_until_ready(step_fn(state, batch_fn(position(step)))[:2])
    run.events.emit("warmup", step=step, warmup_s=round(time.perf_counter() - t0, 6))
    return _Programs(step_fn, batch_fn, position)


def _steps(
    run: Run, state: Any, step: int, programs: _Programs
) -> tuple[Any, int, int, int | None]:
    """Update until the final step or a preemption signal, saving every ``save_every``
    steps (not the final one: that is :meth:`CheckpointManager.finalize`'s). Returns
    ``(state, step, updates made, the signal that stopped the run or None)``.

    A single process stops at the first step boundary after its signal; several stop
    together, one step later (:class:`~recovery.api.ranks.StopVote`).
    """
    opts, ranks, memory, progress = run.opts, run.ranks, run.memory, run.progress
    stop: Callable[[int | None, bool], tuple[int | None, bool]] = (
        (lambda s, c: (s, c)) if ranks is None else StopVote(ranks)
    )
    lead = ranks is None or ranks.rank == 0
    updates = 0
    stopped_by = None
    progress_every = max(1, opts.steps // 10)  # about ten progress lines per run
    while step < opts.steps:
        # Process 0's budget decides when every process keeps a copy (see StopVote).
        wish = memory is not None and lead and memory.due(step)
        stopped_by, copy_now = stop(run.preemption.signal, wish)
        if stopped_by is not None:
            break
        if ranks is not None:
            ranks.step = step
        if progress is not None:
            progress.step_started(step + 1)
        t = time.perf_counter()
        if not updates:
            long_phases.slow_first_step(run)
        state, loss, work_s = programs.step_fn(state, programs.batch_fn(programs.position(step)))
        loss_value = float(loss)  # waits for the step to finish
        step += 1
        updates += 1
        if progress is not None:
            progress.step_finished(step, work_s)
        step_s = time.perf_counter() - t
        run.events.emit(
            "step", step=step, loss=loss_value, step_s=round(step_s, 6), data_position=step - 1
        )
        if step % progress_every == 0 or step == opts.steps:
            run.log(f"step {step}/{opts.steps} loss {loss_value:.4f} ({step_s * 1e3:.1f} ms/step)")
        if step % opts.save_every == 0 and step < opts.steps:
            with run.phase(Phase.save):  # blocks only for the host copy when async
                run.manager.save(step, state, metadata={"data_position": step})
                long_phases.slow_save(run)
        if memory is not None and copy_now and step < opts.steps:
            with run.phase(Phase.save):
                memory.copy(step, state)
        long_phases.between_steps(run, state, step)
        if opts.step_sleep:
            time.sleep(opts.step_sleep)
    return state, step, updates, stopped_by
