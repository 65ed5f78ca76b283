"""The library API: verified checkpoints, preemption, progress reports and the event log for
your own training code (a Flax/Optax loop, your model, your data). One import path;
``docs/library.md`` documents every name in :data:`__all__` (a test keeps the two in step).

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
from recovery.api.processes import (
    EXIT_PEER_LOST,
    Processes,
    Topology,
    failing_together,
    join,
    leave,
    topology_from_env,
)
from recovery.api.progress import ENV_PROGRESS_DIR, Phase, Progress, open_progress, progress_dir
from recovery.checkpoint import SaveResult, StepStatus
from recovery.errors import (
    AllCheckpointsDamagedError,
    BackgroundSaveError,
    CheckpointDamaged,
    CheckpointError,
    CheckpointExistsError,
    ConfigMismatchError,
    GroupError,
    NoCheckpointError,
    PeerLostError,
    RecoverError,
    RunLockedError,
    UsageError,
)

__all__ = [
    "ENV_PROGRESS_DIR",
    "EVENTS",
    "EVENTS_FILE",
    "EXIT_DO_NOT_RESTART",
    "EXIT_PEER_LOST",
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
    "GroupError",
    "Imported",
    "NoCheckpointError",
    "PeerLostError",
    "Phase",
    "Preemption",
    "Processes",
    "Progress",
    "RecoverError",
    "Restored",
    "RunLockedError",
    "SaveResult",
    "Skipped",
    "StepStatus",
    "Topology",
    "UsageError",
    "failing_together",
    "import_orbax",
    "join",
    "leave",
    "open_event_log",
    "open_progress",
    "progress_dir",
    "read_events",
    "topology_from_env",
]
