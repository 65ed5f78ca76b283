"""The leader's lease in a PostgreSQL journal's database (service/journaldb/pglease.py): the
lease contract with two connections (two replicas) beside a live journal whose tables it
leaves alone; a server it cannot reach is a TransientError naming the lease."""

from __future__ import annotations

import pytest

from recovery.errors import TransientError
from recovery.ports.clock import FakeClock
from service.journaldb.pgjournal import PostgresJournal
from service.journaldb.pglease import PgLease
from tests.lease_contract import check_lease_store
from tests.plugins.postgres import PgServer


def test_two_replicas_on_one_database_keep_the_contract(pg_dsn: str) -> None:
    journal = PostgresJournal(pg_dsn, FakeClock())
    a, b = PgLease(pg_dsn), PgLease(pg_dsn)
    try:
        check_lease_store(a, b)
        assert journal.incidents() == []  # the journal still reads its own tables
    finally:
        a.close()
        b.close()
        journal.close()
    c = PgLease(pg_dsn)
    try:
        record = c.read()
        assert record is not None
        assert (record.holder, record.term) == ("", 2)
    finally:
        c.close()


def test_a_server_it_cannot_reach_is_a_transient_error_naming_the_lease(
    pg_server: PgServer,
) -> None:
    dsn = f"host={pg_server.sockets} port={pg_server.port + 1000} user=postgres dbname=x"
    with pytest.raises(TransientError, match="lease 'coordinator' in PostgreSQL"):
        PgLease(dsn)
