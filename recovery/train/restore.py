"""Where a run starts: a fresh state, or the newest checkpoint that verifies - for a job of
several processes, the newest that verifies for every one of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from recovery.checkpoint import Loaded
from recovery.errors import CheckpointError, CheckpointExistsError, StepBehindError
from recovery.train.options import ResumeMode
from recovery.train.saving import log_retention_errors

if TYPE_CHECKING:
    from recovery.train.run import Run


class Restored(NamedTuple):
    step: int
    digest: str
    """State digest of the checkpoint restored."""


def restore_or_init(
    run: Run, template: Any, init: Callable[[], Any]
) -> tuple[Any, Restored | None]:
    """The state to train from, and the checkpoint it came from (None for a fresh state).

    With several processes this is a collective: process 0's listing decides between a
    fresh start and a resume, the processes agree on the step, and only process 0 moves
    refused steps aside and applies retention.
    """
    from recovery.checkpoint import tree

    opts, store, ranks = run.opts, run.store, run.ranks
    existing = store.steps()
    if ranks is not None:
        existing = [int(s) for s in ranks.group.allgather(existing)[0]]
    if opts.resume is ResumeMode.never and existing:
        raise CheckpointExistsError(
            f"{store.root} already holds checkpoints (newest step {existing[-1]}); "
            "pass --resume to continue that run, or choose another --run-dir"
        )
    if ranks is not None and run.memory is not None and opts.resume is not ResumeMode.never:
        from recovery.train.memory import FromMemory, node_name, restore_from_memory

        got = restore_from_memory(
            ranks,
            template,
            run.memory,
            newest_durable=existing[-1] if existing else -1,
            node=node_name(run.environ),
            log=run.log,
        )
        if isinstance(got, FromMemory):
            _check_step(run, got.step)
            run.events.emit(
                "restored",
                step=got.step,
                checkpoint_step=got.step,
                data_position=got.step,
                state_digest=got.digest,
                bytes=got.nbytes,
                restore_s=round(got.seconds, 6),
                fallbacks=0,
                saved_processes=ranks.size,
                source="memory",
                from_rank=got.holder,
                from_node=got.holder_node,
                local_step=got.local_step,
            )
            run.log(
                f"recover: step {got.step} restored from the memory of {got.holder_node} "
                f"(process {got.holder}) in {got.seconds:.2f}s"
            )
            return got.state, Restored(got.step, got.digest)
        run.log(f"recover: not restoring from memory: {got}; using the checkpoints")
        run.events.emit("memory-fallback", step=None, reason=got)
    if opts.resume is ResumeMode.never or (opts.resume is ResumeMode.auto and not existing):
        return init(), None
    t0 = time.perf_counter()
    if ranks is None:
        result = store.restore_latest(run_config=run.config)
    else:
        result = store.restore_agreed(peers=ranks.group.channel("main"), run_config=run.config)
    lead = ranks is None or ranks.rank == 0
    for bad_step, reason in result.fallbacks:
        run.log(f"recover: checkpoint step {bad_step} failed verification ({reason}); falling back")
        moved = store.set_aside(bad_step).name if lead else None
        run.events.emit("fallback", step=bad_step, reason=reason, moved_to=moved)
    loaded = result.loaded
    position = _check_resumable(run, loaded)
    saved_by = int(loaded.manifest.metadata.get("processes", 1))
    processes = 1 if ranks is None else ranks.size
    if saved_by != processes:
        run.log(
            f"recover: checkpoint step {loaded.step} was saved by {saved_by} process(es); "
            f"continuing with {processes} (the state is replicated, so it restores as is; "
            f"from here the run matches a {processes}-process run, not bit for bit a "
            f"{saved_by}-process one)"
        )
    state = tree.from_host(template, loaded.arrays)
    if lead:
        # A run killed between a save and its retention left extra steps; trim them now that
        # the restored step is known to be intact (it is the newest, so it is kept).
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
        saved_processes=saved_by,
        source="checkpoint",
    )
    return state, Restored(loaded.step, loaded.state_digest)


def _check_step(run: Run, step: int) -> None:
    if step > run.opts.steps:
        raise StepBehindError(
            f"--steps {run.opts.steps} is behind the newest intact checkpoint "
            f"(step {step}) in {run.store.root}; pass --steps {step} or more"
        )


def _check_resumable(run: Run, loaded: Loaded) -> object:
    """The data position ``loaded`` records; raises if this run cannot continue from it."""
    _check_step(run, loaded.step)
    position = loaded.manifest.metadata.get("data_position")
    if position != loaded.step:
        raise CheckpointError(
            f"checkpoint step {loaded.step} records data position {position!r}; this "
            "trainer consumes one batch per step, so the checkpoint is not one of its own"
        )
    return position
