"""The domain model: health events in, decisions and actions out."""

from recovery.model.actions import (
    Action,
    Decision,
    Drain,
    PromoteSpare,
    RequeueJobs,
    ReturnToPool,
    SaveThenRequeue,
    TakeDown,
    Verdict,
    action_from_json,
)
from recovery.model.events import SCHEMA_VERSION, DriverAction, EventBatch, HealthEvent, Source

__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "Decision",
    "Drain",
    "DriverAction",
    "EventBatch",
    "HealthEvent",
    "PromoteSpare",
    "RequeueJobs",
    "ReturnToPool",
    "SaveThenRequeue",
    "Source",
    "TakeDown",
    "Verdict",
    "action_from_json",
]
