"""Which checkpoints to keep: a pure function of the committed steps and a policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recovery.errors import UsageError


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep the newest ``keep_last`` steps plus every step divisible by ``keep_every``."""

    keep_last: int = 3
    """How many of the newest checkpoints to keep (>= 1)."""
    keep_every: int | None = None
    """Also keep each step that is a multiple of this (long-term milestones); None: none."""

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise UsageError(f"keep_last must be >= 1 (got {self.keep_last})")
        if self.keep_every is not None and self.keep_every < 1:
            raise UsageError(f"keep_every must be >= 1 or unset (got {self.keep_every})")


def steps_to_delete(
    steps: Sequence[int], policy: RetentionPolicy, *, newest_durable: int
) -> list[int]:
    """Steps the policy lets go, ascending.

    Only steps strictly older than ``newest_durable`` (a checkpoint already on stable
    storage) are ever returned, so the newest checkpoint is never deleted and no older one
    goes before a newer one is durable. Steps newer than it are left alone.
    """
    older_or_equal = sorted(s for s in set(steps) if s <= newest_durable)
    keep = set(older_or_equal[-policy.keep_last :])
    keep.add(newest_durable)
    if policy.keep_every:
        keep.update(s for s in older_or_equal if s % policy.keep_every == 0)
    return [s for s in older_or_equal if s not in keep and s < newest_durable]
