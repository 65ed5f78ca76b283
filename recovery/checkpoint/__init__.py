"""Verified checkpoints: atomic, durable saves and restores that check every byte.

See ``docs/checkpoint-format.md`` for the on-disk format.
"""

from recovery.checkpoint.asyncsave import AsyncCheckpointer
from recovery.checkpoint.lock import RunLock
from recovery.checkpoint.retention import RetentionPolicy, steps_to_delete
from recovery.checkpoint.store import (
    CheckpointStore,
    Loaded,
    RestoreResult,
    SaveResult,
    StepStatus,
)

__all__ = [
    "AsyncCheckpointer",
    "CheckpointStore",
    "Loaded",
    "RestoreResult",
    "RetentionPolicy",
    "RunLock",
    "SaveResult",
    "StepStatus",
    "steps_to_delete",
]
