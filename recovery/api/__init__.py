"""The library API: verified checkpoints, preemption and the event log for your own training
code (a Flax/Optax loop, your model, your data). One import path; ``docs/library.md``
documents every name in :data:`__all__` (a test keeps the two in step).

Importing this package does not import JAX: the functions that convert pytrees import it when
they run, so the names are usable for listing and verifying without the training extra.
"""

from recovery.api.events import EVENTS, EVENTS_FILE, EventLog, open_event_log, read_events
from recovery.api.manager import CheckpointInfo, CheckpointManager, Restored, Skipped
from recovery.api.migrate import Imported, import_orbax
from recovery.api.preemption import (
    EXIT_DO_NOT_RESTART,
    EXIT_PREEMPTED,
    PREEMPT_SIGNALS,
    Preemption,
)
from recovery.checkpoint import SaveResult, StepStatus
from recovery.errors import (
    AllCheckpointsDamagedError,
    BackgroundSaveError,
    CheckpointDamaged,
    CheckpointError,
    CheckpointExistsError,
    ConfigMismatchError,
    NoCheckpointError,
    RecoverError,
    RunLockedError,
    UsageError,
)

# Multi-process helpers (issue 17, second round, once multi-process `recover train` lands):
# the process topology from Slurm's environment, joining jax.distributed, and the helpers K
# processes need around a shared checkpoint go here, in their own module, and in __all__.

__all__ = [
    "EVENTS",
    "EVENTS_FILE",
    "EXIT_DO_NOT_RESTART",
    "EXIT_PREEMPTED",
    "PREEMPT_SIGNALS",
    "AllCheckpointsDamagedError",
    "BackgroundSaveError",
    "CheckpointDamaged",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointInfo",
    "CheckpointManager",
    "ConfigMismatchError",
    "EventLog",
    "Imported",
    "NoCheckpointError",
    "Preemption",
    "RecoverError",
    "Restored",
    "RunLockedError",
    "SaveResult",
    "Skipped",
    "StepStatus",
    "UsageError",
    "import_orbax",
    "open_event_log",
    "read_events",
]
