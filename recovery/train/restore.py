"""Where a run starts: a fresh state, a surviving node's copy in memory, or the newest
checkpoint that verifies (through :class:`recovery.api.CheckpointManager`) - for a job of
several processes, the newest that verifies for every one of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from recovery.errors import CheckpointError, CheckpointExistsError, StepBehindError
from recovery.train.options import ResumeMode

if TYPE_CHECKING:
    from recovery.train.run import Run


class ResumedFrom(NamedTuple):
    """The state a run resumed from: its step and state digest."""

    step: int
    digest: str
    """State digest of the checkpoint (or memory copy) restored."""


def restore_or_init(
    run: Run, template: Any, init: Callable[[], Any]
) -> tuple[Any, ResumedFrom | None]:
    """The state to train from, and where it came from (None for a fresh state).

    With several processes this is a collective: process 0's listing decides between a
    fresh start and a resume, the processes agree on the step, and only process 0 moves
    refused steps aside and applies retention.
    """
    opts, manager, ranks = run.opts, run.manager, run.ranks
    existing = manager.steps()
    if ranks is not None:
        existing = [int(s) for s in ranks.group.allgather(existing)[0]]
    if opts.resume is ResumeMode.never and existing:
        raise CheckpointExistsError(
            f"{manager.directory} already holds checkpoints (newest step {existing[-1]}); "
            "pass --resume to continue that run, or choose another --run-dir"
        )
    if ranks is not None and run.memory is not None and opts.resume is not ResumeMode.never:
        from recovery.api.memory import FromMemory, node_name, restore_from_memory

        got = restore_from_memory(
            ranks.group,
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
            return got.state, ResumedFrom(got.step, got.digest)
        run.log(f"recover: not restoring from memory: {got}; using the checkpoints")
        run.events.emit("memory-fallback", step=None, reason=got)
    if opts.resume is ResumeMode.never or (opts.resume is ResumeMode.auto and not existing):
        return init(), None
    restored = manager.restore(template)
    _check_resumable(run, restored.step, restored.metadata)
    saved_by = int(restored.metadata.get("processes", 1))
    processes = 1 if ranks is None else ranks.size
    if saved_by != processes:
        run.log(
            f"recover: checkpoint step {restored.step} was saved by {saved_by} process(es); "
            f"continuing with {processes} (the state is replicated, so it restores as is; "
            f"from here the run matches a {processes}-process run, not bit for bit a "
            f"{saved_by}-process one)"
        )
    return restored.state, ResumedFrom(restored.step, restored.state_digest)


def _check_step(run: Run, step: int) -> None:
    if step > run.opts.steps:
        raise StepBehindError(
            f"--steps {run.opts.steps} is behind the newest intact checkpoint "
            f"(step {step}) in {run.manager.directory}; pass --steps {step} or more"
        )


def _check_resumable(run: Run, step: int, metadata: Mapping[str, Any]) -> None:
    """Raises if this run cannot continue from checkpoint ``step`` with ``metadata``."""
    _check_step(run, step)
    position = metadata.get("data_position")
    if position != step:
        raise CheckpointError(
            f"checkpoint step {step} records data position {position!r}; this "
            "trainer consumes one batch per step, so the checkpoint is not one of its own"
        )
