"""Fixtures of the service tests: a journal on a real temporary SQLite file, a running API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.ports.clock import FakeClock
from service.journaldb.journal import SqliteJournal
from service.journaldb.sqljournal import SqlJournal
from tests.service.helpers import Api, running_api


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def journal(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[SqlJournal]:
    """The journal on each backend: a SQLite file, and a fresh PostgreSQL database."""
    j: SqlJournal
    if request.param == "sqlite":
        j = SqliteJournal(tmp_path / "journal.db", clock)
    else:
        from service.journaldb.pgjournal import PostgresJournal

        j = PostgresJournal(request.getfixturevalue("pg_dsn"), clock)
    yield j
    j.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with running_api(tmp_path, max_body_bytes=20_000) as running:
        yield running
