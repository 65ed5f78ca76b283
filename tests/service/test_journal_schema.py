"""The journal's schema version: older files are migrated on open, newer ones refused."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from recovery.errors import JournalError
from recovery.ports.clock import FakeClock
from service.journaldb.journal import SqliteJournal
from service.journaldb.schema import MIGRATIONS, SCHEMA_VERSION
from tests.service.helpers import event


def _file_at_version(path: Path, version: int) -> None:
    """A journal as release ``version`` of the schema left it, holding one event."""
    conn = sqlite3.connect(path, isolation_level=None)
    for v in range(version):
        conn.executescript(f"BEGIN; {MIGRATIONS[v]} PRAGMA user_version = {v + 1}; COMMIT;")
    conn.execute(
        "INSERT INTO events(id, node, body, received_wall, received_mono) VALUES (?, ?, ?, ?, ?)",
        ("ev-1", "n1", event(1).model_dump_json(), 1.0, 2.0),
    )
    conn.close()


def _user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_a_new_file_gets_the_current_version(tmp_path: Path) -> None:
    SqliteJournal(tmp_path / "j.db", FakeClock()).close()
    assert _user_version(tmp_path / "j.db") == SCHEMA_VERSION


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_older_versions_are_migrated_keeping_their_data(tmp_path: Path, version: int) -> None:
    path = tmp_path / "j.db"
    _file_at_version(path, version)
    clock = FakeClock()
    j = SqliteJournal(path, clock)
    try:
        assert [s.event for s in j.undecided()] == [event(1)]
        assert j.get_meta(f"migrated:{version}->{SCHEMA_VERSION}") == str(
            [clock.now().wall, clock.now().mono]
        )
        indexes = {
            row[0]
            for row in j._writer.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
        assert {"events_undecided", "actions_by_status"} <= indexes
    finally:
        j.close()
    assert _user_version(path) == SCHEMA_VERSION


def test_a_newer_version_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _file_at_version(path, SCHEMA_VERSION)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(JournalError, match=rf"schema version {SCHEMA_VERSION + 1}, newer"):
        SqliteJournal(path, FakeClock())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert _user_version(path) == SCHEMA_VERSION + 1
