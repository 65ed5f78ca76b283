"""The journal port on SQLite: :class:`SqliteJournal`.

Durability: the file is in WAL mode with ``synchronous=FULL``, and every write method is one
``BEGIN IMMEDIATE ... COMMIT`` transaction, so when a method returns its effect is in the
fsynced write-ahead log and survives a crash of the process or of the machine.

Threads: the HTTP server's commit thread, its request threads and the coordinator's engine
thread use one journal at once. All writes go through a single writer connection behind a
lock (SQLite allows one writer at a time anyway; the lock makes the wait explicit instead of a
busy-retry), while each reading thread gets its own read-only connection, created on first
use: in WAL mode readers see the last committed state and never wait for the writer. Each
read method runs in one read transaction, so what it returns is one consistent snapshot.

Schema and migrations: :mod:`service.journaldb.schema`; checkpoints of the WAL run on a thread
of their own (:mod:`service.journaldb.walcheckpoint`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recovery.errors import JournalError
from recovery.fsutil import fsync_dir
from recovery.ports.clock import Clock
from service.journaldb.schema import MIGRATIONS, SCHEMA_VERSION
from service.journaldb.sqljournal import SqlJournal
from service.journaldb.walcheckpoint import WalCheckpointer

#: How long a connection waits for a lock held by another process, in milliseconds.
BUSY_TIMEOUT_MS = 10_000


class SqliteJournal(SqlJournal):
    """The :class:`recovery.ports.journal.Journal` port on one SQLite file at ``path``.

    Opening creates the file (and makes its directory entry durable) or upgrades an older
    schema. Failure modes: :class:`JournalError` (chained to the sqlite3 error) when the file
    cannot be opened, read or written, is not a journal, or has a schema newer than this code.
    """

    def __init__(self, path: Path, clock: Clock, *, checkpoint_every_s: float | None = 1.0) -> None:
        """``checkpoint_every_s``: how often a background thread copies the WAL into the
        database (:mod:`service.journaldb.walcheckpoint`); None leaves it to SQLite, inside
        commits."""
        self.path = Path(path)
        self._clock = clock
        # Reentrant: a batch holds it throughout, and the writes inside take it again.
        self._lock = threading.RLock()
        self._batching = False  # read and set only by the thread holding _lock
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._closed = False
        existed = self.path.exists()
        with self._errors("open"):
            self._writer = self._connect()
        try:
            with self._errors("open"):
                version = self._check_version()  # before anything that writes to the file
                mode = self._writer.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode != "wal":
                    raise JournalError(f"journal {self.path}: WAL mode refused (got {mode!r})")
                self._writer.execute("PRAGMA synchronous=FULL")
                self._migrate(version)
                if checkpoint_every_s is not None:
                    self._writer.execute("PRAGMA wal_autocheckpoint=0")
            if not existed:
                fsync_dir(self.path.parent)
        except BaseException:
            self._writer.close()
            raise
        self._checkpointer = (
            None
            if checkpoint_every_s is None
            else WalCheckpointer(self._connect, checkpoint_every_s)
        )

    # --- connections and transactions ------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; every write says BEGIN itself.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise JournalError(f"journal {self.path}: cannot {what}: {e}") from e

    def _check_version(self) -> int:
        version = int(self._writer.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"journal {self.path} has schema version {version}, newer than this code's "
                f"{SCHEMA_VERSION}: it was written by a newer release. Upgrade this program; "
                "the file was left untouched."
            )
        return version

    def _migrate(self, version: int) -> None:
        for v in range(version, SCHEMA_VERSION):
            # One script per step: the new tables and the new version commit together.
            self._writer.executescript(
                f"BEGIN IMMEDIATE;\n{MIGRATIONS[v]}\nPRAGMA user_version = {v + 1};\nCOMMIT;"
            )
        if version < SCHEMA_VERSION:
            stamp = self._clock.now()
            with self._write("record migration") as c:
                c.execute(
                    "INSERT INTO meta(key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (f"migrated:{version}->{SCHEMA_VERSION}", json.dumps([stamp.wall, stamp.mono])),
                )

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction on the writer connection, committed (and synced) on exit;
        inside a :meth:`batch`, a savepoint of the batch's transaction instead."""
        with self._lock:
            self._check_open()
            conn = self._writer
            with self._errors(what):
                if self._batching:
                    yield from self._savepoint(conn)
                    return
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")

    @staticmethod
    def _savepoint(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        # A write that fails inside a batch leaves nothing of itself; the batch goes on.
        conn.execute("SAVEPOINT write")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK TO write")
            conn.execute("RELEASE write")
            raise
        conn.execute("RELEASE write")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run this thread's writes inside one transaction, committed and synced once on exit:
        one fsync for a burst of small writes (the decisions of an engine step) instead of
        one each.

        Every write method inside stays atomic by itself (a savepoint): one that raises leaves
        nothing and the others stand. On exit, also by an exception, what was written is
        committed; the exception then propagates. Nothing inside is durable before the exit,
        so act on none of it (call Slurm) until then. Reads use their own connection and see
        the batch's writes only after the exit. Writes from other threads wait for the end:
        keep batches short. A batch inside a batch joins it. Raises JournalError when the
        journal is closed or the commit fails.
        """
        with self._lock:
            if self._batching:
                yield
                return
            self._check_open()
            with self._errors("begin a batch"):
                self._writer.execute("BEGIN IMMEDIATE")
            self._batching = True
            try:
                yield
            finally:
                self._batching = False
                with self._errors("commit a batch"):
                    self._writer.execute("COMMIT")

    @contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        """One read transaction (one snapshot) on this thread's reader connection."""
        self._check_open()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        with self._errors(what):
            if conn is None:
                conn = self._connect()
                conn.execute("PRAGMA query_only=ON")
                with self._lock:
                    self._readers.append(conn)
                self._local.conn = conn
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError(f"journal {self.path} is closed")

    def close(self) -> None:
        """Close every connection (the writer's and each thread's reader). Idempotent; any
        later call raises JournalError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._checkpointer is not None:
                self._checkpointer.stop()
            for conn in [*self._readers, self._writer]:
                conn.close()
            self._readers.clear()
