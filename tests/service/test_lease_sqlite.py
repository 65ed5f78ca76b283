"""The leader's lease in the journal's SQLite file (service/journaldb/lease.py): the lease
contract with two connections on one file (two replicas), beside a live journal whose tables
it leaves alone; an unreadable place is a TransientError naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.errors import TransientError
from recovery.ports.clock import FakeClock
from service.journaldb.journal import SqliteJournal
from service.journaldb.lease import SqliteLease
from tests.lease_contract import check_lease_store


def test_two_replicas_on_one_journal_file_keep_the_contract(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    journal = SqliteJournal(path, FakeClock(), checkpoint_every_s=None)
    a, b = SqliteLease(path), SqliteLease(path)
    try:
        check_lease_store(a, b)
        assert journal.incidents() == []  # the journal still reads its own tables
    finally:
        a.close()
        b.close()
        journal.close()
    # Reopened, the record is where it was.
    c = SqliteLease(path)
    try:
        record = c.read()
        assert record is not None
        assert (record.holder, record.term) == ("", 2)
    finally:
        c.close()


def test_a_lease_it_cannot_open_is_a_transient_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TransientError, match="missing"):
        SqliteLease(tmp_path / "missing" / "journal.sqlite")
