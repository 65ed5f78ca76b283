"""The leader's lease in the PostgreSQL journal's database
(:class:`~recovery.ports.lease.LeaseStore`), for replicas that share a PostgreSQL journal: one
row per lease name in a table of its own, ``lease``, written with compare-and-set on a version
number, as :mod:`service.journaldb.lease` does in SQLite. The table is created when absent.

Each call is one statement on a connection of its own (autocommit), with a statement timeout
shorter than a renewal's deadline: a server that does not answer is a failed round, not a
renewal that hangs past the point where the leader must stop acting.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from recovery.errors import TransientError
from recovery.ports.lease import LeaseConflict, LeaseRecord

_TABLE = """
CREATE TABLE IF NOT EXISTS lease (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    term INTEGER NOT NULL,
    duration_s DOUBLE PRECISION NOT NULL,
    renewed_wall DOUBLE PRECISION NOT NULL,
    version BIGINT NOT NULL
)
"""


class PgLease:
    """The lease ``name`` in the PostgreSQL database at ``dsn``. ``timeout_s`` bounds
    connecting and each statement."""

    def __init__(self, dsn: str, name: str = "coordinator", *, timeout_s: float = 1.0) -> None:
        self.dsn = dsn
        self.name = name
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._run(_TABLE, ())

    @property
    def where(self) -> str:
        try:
            info = conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return f"lease {self.name!r} in PostgreSQL"
        return f"lease {self.name!r} in PostgreSQL {info.get('dbname', '')} at {info.get('host')}"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def read(self) -> LeaseRecord | None:
        row = self._run(
            "SELECT holder, term, duration_s, renewed_wall, version FROM lease WHERE name = %s",
            (self.name,),
        ).fetchone()
        if row is None:
            return None
        holder, term, duration_s, renewed_wall, version = row
        return LeaseRecord(str(holder), int(term), float(duration_s), str(version), renewed_wall)

    def create(self, holder: str, duration_s: float, now_wall: float) -> LeaseRecord:
        done = self._run(
            "INSERT INTO lease (name, holder, term, duration_s, renewed_wall, version) "
            "VALUES (%s, %s, 1, %s, %s, 1) ON CONFLICT (name) DO NOTHING",
            (self.name, holder, duration_s, now_wall),
        )
        if done.rowcount != 1:
            raise LeaseConflict(self.where)
        return LeaseRecord(holder, 1, duration_s, "1", now_wall)

    def update(
        self, prior: LeaseRecord, holder: str, term: int, duration_s: float, now_wall: float
    ) -> LeaseRecord:
        version = int(prior.version) + 1
        done = self._run(
            "UPDATE lease SET holder = %s, term = %s, duration_s = %s, renewed_wall = %s, "
            "version = %s WHERE name = %s AND version = %s",
            (holder, term, duration_s, now_wall, version, self.name, int(prior.version)),
        )
        if done.rowcount != 1:
            raise LeaseConflict(self.where)
        return LeaseRecord(holder, term, duration_s, str(version), now_wall)

    def _run(self, sql: str, args: tuple[object, ...]) -> psycopg.Cursor[Any]:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    timeout_ms = max(1, int(self.timeout_s * 1000))
                    self._conn = psycopg.connect(
                        self.dsn,
                        autocommit=True,
                        connect_timeout=max(1, round(self.timeout_s)),
                        options=f"-c statement_timeout={timeout_ms}",
                    )
                return self._conn.execute(sql, args)
            except psycopg.Error as e:  # unreachable, restarting, timed out ...
                raise TransientError(f"{self.where}: {e}") from e
