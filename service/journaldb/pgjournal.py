"""The journal port on PostgreSQL: :class:`PostgresJournal`, for coordinator replicas that run
on several machines and share one journal (SQLite stays the embedded default for one machine).

Same tables and meaning as the SQLite schema (:mod:`service.journaldb.schema`), in
PostgreSQL's types: stamps as ``DOUBLE PRECISION``, and a ``rowid BIGSERIAL`` column where
SQLite orders by its implicit rowid (incidents and phases). Event numbers (``seq``) come from
a sequence, taken under a table lock held to the commit, so they follow the order of the
commits, as SQLite's do.

Durability: every write method is one transaction, committed with the server's default
``synchronous_commit = on``: when a method returns, its effect survives a crash of the server.

Threads and connections: writes go through one connection behind a lock (a batch holds it),
reads through one connection per reading thread, each read in one ``REPEATABLE READ READ
ONLY`` transaction (one snapshot). Other processes (replicas) write beside this one; the
event table's lock keeps their appends in order. A connection the server dropped (a restart)
is opened again on the next call; the call that found it dropped fails with JournalError and
its transaction left nothing.

Schema version: table ``journal_schema`` (one row); a database whose version is newer than
this code's is never touched.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from recovery.errors import JournalError
from recovery.ports.clock import Clock
from service.journaldb.rows import Rows, Sql
from service.journaldb.sqljournal import SqlJournal

_V1 = """
CREATE TABLE events (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    node TEXT NOT NULL,
    body TEXT NOT NULL,
    received_wall DOUBLE PRECISION NOT NULL,
    received_mono DOUBLE PRECISION NOT NULL,
    decided INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE incidents (
    id TEXT PRIMARY KEY,
    rowid BIGSERIAL NOT NULL,
    node TEXT NOT NULL,
    fault TEXT NOT NULL,
    verdict TEXT NOT NULL,
    status TEXT NOT NULL,
    opened_wall DOUBLE PRECISION NOT NULL,
    opened_mono DOUBLE PRECISION NOT NULL,
    closed_wall DOUBLE PRECISION,
    closed_mono DOUBLE PRECISION,
    jobs TEXT NOT NULL DEFAULT '[]',
    info TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE decisions (
    event_id TEXT PRIMARY KEY REFERENCES events(id),
    incident TEXT REFERENCES incidents(id),
    body TEXT NOT NULL,
    at_wall DOUBLE PRECISION NOT NULL,
    at_mono DOUBLE PRECISION NOT NULL
);
CREATE TABLE actions (
    id BIGSERIAL PRIMARY KEY,
    incident TEXT NOT NULL REFERENCES incidents(id),
    event_id TEXT NOT NULL REFERENCES events(id),
    position INTEGER NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '',
    planned_wall DOUBLE PRECISION,
    planned_mono DOUBLE PRECISION,
    finished_wall DOUBLE PRECISION,
    finished_mono DOUBLE PRECISION
);
CREATE TABLE phases (
    incident TEXT NOT NULL REFERENCES incidents(id),
    name TEXT NOT NULL,
    rowid BIGSERIAL NOT NULL,
    wall DOUBLE PRECISION NOT NULL,
    mono DOUBLE PRECISION NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (incident, name)
);
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE INDEX events_undecided ON events(seq) WHERE decided = 0;
CREATE INDEX actions_by_status ON actions(status, id);
CREATE INDEX actions_by_incident ON actions(incident, id);
CREATE INDEX decisions_by_incident ON decisions(incident);
"""

MIGRATIONS: tuple[str, ...] = (_V1,)
"""``MIGRATIONS[v]`` upgrades a database at version ``v`` to ``v + 1``."""
SCHEMA_VERSION = len(MIGRATIONS)

_MARK = re.compile(r"\?")


def _dialect(sql: str) -> str:
    """The journal's SQL (``?`` parameters) in psycopg's form (``%s``; no ``%`` is ever
    written by the journal, so none needs escaping)."""
    return _MARK.sub("%s", sql)


class _Conn:
    """A psycopg connection speaking the journal's SQL (:class:`~service.journaldb.rows.Sql`)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Rows:
        return self.conn.execute(_dialect(sql), parameters)

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any:
        with self.conn.cursor() as cur:
            cur.executemany(_dialect(sql), parameters)


class PostgresJournal(SqlJournal):
    """The :class:`recovery.ports.journal.Journal` port on the PostgreSQL database at ``dsn``
    (a libpq connection string or URL: ``postgresql://user@host/db``, ``host=/run/pg
    dbname=recover``).

    Opening creates the tables or upgrades an older schema. Failure modes: JournalError
    (chained to psycopg's error) when the server cannot be reached, refuses, or holds a
    schema newer than this code.
    """

    def __init__(self, dsn: str, clock: Clock, *, connect_timeout_s: float = 5.0) -> None:
        self.dsn = dsn
        self._clock = clock
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.RLock()
        self._batching = False
        self._local = threading.local()
        self._readers: list[psycopg.Connection[Any]] = []
        self._closed = False
        self._writer: psycopg.Connection[Any] | None = None
        with self._lock, self._errors("open"):
            self._migrate()

    @property
    def where(self) -> str:
        """The database, named for people (no password)."""
        try:
            info = conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return "the PostgreSQL journal"
        host = info.get("host", "localhost")
        return f"PostgreSQL {info.get('dbname', '')} at {host}:{info.get('port', 5432)}"

    # --- connections and transactions ------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=max(1, round(self._connect_timeout_s))
        )

    def _writer_conn(self) -> psycopg.Connection[Any]:
        if self._writer is None or self._writer.closed or self._writer.broken:
            self._writer = self._connect()
        return self._writer

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as e:
            raise JournalError(f"journal {self.where}: cannot {what}: {e}") from e

    def _migrate(self) -> None:
        conn = self._writer_conn()
        conn.execute("CREATE TABLE IF NOT EXISTS journal_schema (version INTEGER NOT NULL)")
        with conn.transaction():
            # One migrating replica at a time; the others find the work done.
            conn.execute("LOCK TABLE journal_schema IN ACCESS EXCLUSIVE MODE")
            row = conn.execute("SELECT version FROM journal_schema").fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"journal {self.where} has schema version {version}, newer than this "
                    f"code's {SCHEMA_VERSION}: it was written by a newer release. Upgrade this "
                    "program; the database was left untouched."
                )
            for v in range(version, SCHEMA_VERSION):
                conn.execute(MIGRATIONS[v])
            if row is None:
                conn.execute("INSERT INTO journal_schema VALUES (%s)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                conn.execute("UPDATE journal_schema SET version = %s", (SCHEMA_VERSION,))
            if version < SCHEMA_VERSION:
                stamp = self._clock.now()
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES (%s, %s) ON CONFLICT(key) "
                    "DO UPDATE SET value = excluded.value",
                    (f"migrated:{version}->{SCHEMA_VERSION}", json.dumps([stamp.wall, stamp.mono])),
                )

    def _control(self, conn: psycopg.Connection[Any], statement: str) -> None:
        """BEGIN, COMMIT, ROLLBACK and savepoints: every one goes through here."""
        conn.execute(statement)

    @contextmanager
    def _write(self, what: str) -> Iterator[Sql]:
        """One write transaction, committed on exit; inside a :meth:`batch`, a savepoint of
        the batch's transaction instead (a write that fails leaves nothing of itself)."""
        with self._lock:
            self._check_open()
            with self._errors(what):
                conn = self._writer_conn()
                begin, commit, undo = (
                    ("SAVEPOINT write", "RELEASE write", "ROLLBACK TO write")
                    if self._batching
                    else ("BEGIN", "COMMIT", "ROLLBACK")
                )
                self._control(conn, begin)
                try:
                    yield _Conn(conn)
                except BaseException:
                    if not conn.broken:
                        self._control(conn, undo)
                        if self._batching:
                            self._control(conn, "RELEASE write")
                    raise
                self._control(conn, commit)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """As :meth:`service.journaldb.journal.SqliteJournal.batch`: this thread's writes in
        one transaction, committed once on exit (also by an exception, which then
        propagates); each write inside stays atomic by itself."""
        with self._lock:
            if self._batching:
                yield
                return
            self._check_open()
            with self._errors("begin a batch"):
                conn = self._writer_conn()
                self._control(conn, "BEGIN")
            self._batching = True
            try:
                yield
            finally:
                self._batching = False
                with self._errors("commit a batch"):
                    self._control(conn, "COMMIT")

    @contextmanager
    def _read(self, what: str) -> Iterator[Sql]:
        self._check_open()
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        with self._errors(what):
            if conn is None or conn.closed or conn.broken:
                conn = self._connect()
                with self._lock:
                    self._readers.append(conn)
                self._local.conn = conn
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield _Conn(conn)
            finally:
                if not conn.broken:
                    conn.execute("COMMIT")

    def _lock_events(self, c: Sql) -> None:
        # Held to the commit: appends from every replica commit one after another, so the
        # sequence's numbers follow the commits and no reader sees 7 before 6 exists.
        c.execute("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE")

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError(f"journal {self.where} is closed")

    def close(self) -> None:
        """Close every connection. Idempotent; any later call raises JournalError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for conn in [*self._readers, *([self._writer] if self._writer else [])]:
                conn.close()
            self._readers.clear()
