"""What every phase of one ``recover train`` process shares (:class:`Run`), apart from the
loop so that restoring and the memory tier can be read without it."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recovery.api.manager import CheckpointManager
from recovery.api.memory import MemoryTier
from recovery.api.preemption import Preemption
from recovery.api.ranks import Log, Ranks
from recovery.events import EventLog
from recovery.progress import Phase, ProgressWriter
from recovery.train.options import TrainOptions

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from recovery.train.model import ModelSpec


@dataclass(frozen=True)
class Run:
    """What every phase of one training process shares, fixed once the run lock is held."""

    opts: TrainOptions
    spec: ModelSpec
    mesh: Mesh
    config: dict[str, Any]
    """The run configuration stored in (and checked against) every checkpoint."""
    manager: CheckpointManager
    """The run's checkpoints; this process is its writer (process 0 holds the lock)."""
    events: EventLog
    log: Log
    preemption: Preemption
    ranks: Ranks | None = None
    """This process's group in a multi-process run; None for a single process."""
    memory: MemoryTier | None = None
    """Node-local copies of the state (``--memory-every``); None: off."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """The environment the run was started with (what :func:`run_training` was given)."""
    progress: ProgressWriter | None = None
    """This process's progress record (what the job's watcher reads); None: not reported."""

    def phase(self, phase: Phase) -> AbstractContextManager[None]:
        """``with run.phase(Phase.save): ...``: the block is ``phase`` in this process's
        progress record, when it keeps one."""
        return nullcontext() if self.progress is None else self.progress.phase(phase)
