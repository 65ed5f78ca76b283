"""Verified checkpoints: atomic, durable saves and restores that check every byte.

See ``docs/checkpoint-format.md`` for the on-disk format.
"""

from recovery.checkpoint.asyncsave import AsyncCheckpointer
from recovery.checkpoint.lock import RunLock
from recovery.checkpoint.retention import RetentionPolicy, steps_to_delete
from recovery.checkpoint.shared import SharedSaveError
from recovery.checkpoint.store import (
    CheckpointStore,
    Loaded,
    Peers,
    RestoreResult,
    SaveResult,
    StepStatus,
)

__all__ = [
    "AsyncCheckpointer",
    "CheckpointStore",
    "Loaded",
    "Peers",
    "RestoreResult",
    "RetentionPolicy",
    "RunLock",
    "SaveResult",
    "SharedSaveError",
    "StepStatus",
    "steps_to_delete",
]
