"""An in-memory :class:`~recovery.ports.lease.LeaseStore` for the election's pure tests: the
same compare-and-set as the real stores (tests/lease_contract.py holds all three to it), and
switches that make it fail the way a store does (unreachable; a write that lands but whose
answer is lost)."""

from __future__ import annotations

from recovery.errors import TransientError
from recovery.ports.lease import LeaseConflict, LeaseRecord


class MemoryLease:
    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.down = False
        """Every call fails as an unreachable store does."""
        self.lose_answers = False
        """Writes land, then fail as if the answer was lost."""
        self._version = 0

    @property
    def where(self) -> str:
        return "lease in memory"

    def read(self) -> LeaseRecord | None:
        self._reach()
        return self.record

    def create(self, holder: str, duration_s: float, now_wall: float) -> LeaseRecord:
        self._reach()
        if self.record is not None:
            raise LeaseConflict(self.where)
        return self._write(holder, 1, duration_s, now_wall)

    def update(
        self, prior: LeaseRecord, holder: str, term: int, duration_s: float, now_wall: float
    ) -> LeaseRecord:
        self._reach()
        if self.record is None or self.record.version != prior.version:
            raise LeaseConflict(self.where)
        return self._write(holder, term, duration_s, now_wall)

    def _reach(self) -> None:
        if self.down:
            raise TransientError("the lease store is unreachable")

    def _write(self, holder: str, term: int, duration_s: float, now_wall: float) -> LeaseRecord:
        self._version += 1
        self.record = LeaseRecord(holder, term, duration_s, str(self._version), now_wall)
        if self.lose_answers:
            raise TransientError("the answer was lost")
        return self.record
