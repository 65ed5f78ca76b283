"""What every :class:`~recovery.ports.lease.LeaseStore` must do, run against each (the memory
fake, SQLite, a real kube-apiserver's Lease): ``a`` and ``b`` are two handles on the same,
absent lease (two replicas)."""

from __future__ import annotations

import pytest

from recovery.ports.lease import LeaseConflict, LeaseStore


def check_lease_store(a: LeaseStore, b: LeaseStore) -> None:
    assert a.read() is None
    first = a.create("r1", 6.0, 1_800_000_000.0)
    assert (first.holder, first.term, first.duration_s) == ("r1", 1, 6.0)
    # Only one create wins.
    with pytest.raises(LeaseConflict):
        b.create("r2", 6.0, 1_800_000_000.5)
    seen = b.read()
    assert seen is not None
    assert (seen.holder, seen.term, seen.version) == ("r1", 1, first.version)
    assert seen.renewed_wall == pytest.approx(1_800_000_000.0, abs=1e-3)
    # A renewal changes the version; a write from the old version then conflicts.
    renewed = a.update(first, "r1", 1, 6.0, 1_800_000_001.0)
    assert renewed.version != first.version
    assert renewed.renewed_wall == pytest.approx(1_800_000_001.0, abs=1e-3)
    with pytest.raises(LeaseConflict):
        b.update(seen, "r2", 2, 6.0, 1_800_000_002.0)
    # A take from the current version wins, at the next term; the old holder's renewal fails.
    taken = b.update(renewed, "r2", 2, 6.0, 1_800_000_008.0)
    assert (taken.holder, taken.term) == ("r2", 2)
    with pytest.raises(LeaseConflict):
        a.update(renewed, "r1", 1, 6.0, 1_800_000_008.5)
    now = a.read()
    assert now is not None
    assert (now.holder, now.term, now.version) == ("r2", 2, taken.version)
    # Given up: no holder, the term kept.
    given = b.update(taken, "", 2, 6.0, 1_800_000_009.0)
    assert (given.holder, given.term) == ("", 2)
    again = a.read()
    assert again is not None
    assert (again.holder, again.term) == ("", 2)
    assert a.where
