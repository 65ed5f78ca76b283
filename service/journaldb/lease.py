"""The leader's lease in the journal's SQLite database (:class:`~recovery.ports.lease.LeaseStore`),
for replicas without Kubernetes that share the journal's file (one machine, or a filesystem
with working locks): one row per lease name in a table of its own, ``lease``, written with
compare-and-set on a version number. The table is created when absent; the journal's own
tables and migrations are left alone.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from recovery.errors import TransientError
from recovery.ports.lease import LeaseConflict, LeaseRecord

#: How long a write waits for another connection's lock before it counts as a failed round.
BUSY_TIMEOUT_MS = 2000

_TABLE = """
CREATE TABLE IF NOT EXISTS lease (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    term INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    renewed_wall REAL NOT NULL,
    version INTEGER NOT NULL
)
"""


class SqliteLease:
    """The lease ``name`` in the SQLite database at ``path``."""

    def __init__(self, path: Path, name: str = "coordinator") -> None:
        self.path = path
        self.name = name
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._conn.execute(_TABLE)
        except sqlite3.Error as e:
            raise TransientError(f"the lease in {path}: {e}") from e

    @property
    def where(self) -> str:
        return f"lease {self.name!r} in {self.path}"

    def close(self) -> None:
        self._conn.close()

    def read(self) -> LeaseRecord | None:
        row = self._run(
            "SELECT holder, term, duration_s, renewed_wall, version FROM lease WHERE name = ?",
            (self.name,),
        ).fetchone()
        if row is None:
            return None
        holder, term, duration_s, renewed_wall, version = row
        return LeaseRecord(str(holder), int(term), float(duration_s), str(version), renewed_wall)

    def create(self, holder: str, duration_s: float, now_wall: float) -> LeaseRecord:
        try:
            self._run(
                "INSERT INTO lease (name, holder, term, duration_s, renewed_wall, version) "
                "VALUES (?, ?, 1, ?, ?, 1)",
                (self.name, holder, duration_s, now_wall),
            )
        except sqlite3.IntegrityError as e:
            raise LeaseConflict(self.where) from e
        return LeaseRecord(holder, 1, duration_s, "1", now_wall)

    def update(
        self, prior: LeaseRecord, holder: str, term: int, duration_s: float, now_wall: float
    ) -> LeaseRecord:
        version = int(prior.version) + 1
        done = self._run(
            "UPDATE lease SET holder = ?, term = ?, duration_s = ?, renewed_wall = ?, "
            "version = ? WHERE name = ? AND version = ?",
            (holder, term, duration_s, now_wall, version, self.name, int(prior.version)),
        )
        if done.rowcount != 1:
            raise LeaseConflict(self.where)
        return LeaseRecord(holder, term, duration_s, str(version), now_wall)

    def _run(self, sql: str, args: tuple[object, ...]) -> sqlite3.Cursor:
        with self._lock:
            try:
                return self._conn.execute(sql, args)
            except sqlite3.IntegrityError:
                raise
            except sqlite3.Error as e:  # locked past the busy timeout, the disk, ...
                raise TransientError(f"{self.where}: {e}") from e
