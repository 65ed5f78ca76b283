"""A lease as a port: one record that at most one coordinator replica holds at a time (the
leader), written with optimistic concurrency. Two adapters: a Kubernetes ``Lease`` object
(``coordination.k8s.io/v1``, :mod:`k8s.lease`) and a row of the journal's database
(:mod:`service.journaldb.lease`). The election itself is pure (:mod:`recovery.coordinator.leader`).

The store is not trusted for time: a replica judges a record expired by its own monotonic
clock, from when it first saw that record's version unchanged (as Kubernetes' own leader
election does), so clocks that disagree between machines cannot make two leaders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class LeaseConflict(Exception):
    """The record changed (or was created) since it was read: someone else wrote first."""


@dataclass(frozen=True)
class LeaseRecord:
    """The lease as stored."""

    holder: str
    """The holder's identity ("" after a holder gave it up)."""
    term: int
    """How many times the lease changed hands (Kubernetes' ``leaseTransitions``): a new
    leader's term is one more than the last, so anything a leader stamps with its term can be
    told from what an older one wrote."""
    duration_s: float
    """How long the holder may go without renewing before others may take it."""
    version: str
    """The store's concurrency token (a resourceVersion, a row version): an update names the
    one it read and fails with :class:`LeaseConflict` if it changed."""
    renewed_wall: float = 0.0
    """When the holder last renewed, by its clock (shown to people; never used to judge)."""


class LeaseStore(Protocol):
    """Where the lease lives."""

    @property
    def where(self) -> str:
        """The lease, named for people (``Lease recover/recover-coordinator``, a file)."""
        ...

    def read(self) -> LeaseRecord | None:
        """The record now, None when there is none yet."""
        ...

    def create(self, holder: str, duration_s: float, now_wall: float) -> LeaseRecord:
        """Create the record held by ``holder`` at term 1; LeaseConflict if one exists."""
        ...

    def update(
        self, prior: LeaseRecord, holder: str, term: int, duration_s: float, now_wall: float
    ) -> LeaseRecord:
        """Replace ``prior`` (by its version) with ``holder`` at ``term``; LeaseConflict
        when the record is no longer ``prior``."""
        ...
