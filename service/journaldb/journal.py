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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from recovery.errors import JournalError
from recovery.fsutil import fsync_dir
from recovery.model import Decision, HealthEvent
from recovery.ports.clock import Clock, Stamp
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    IncidentInfo,
    IncidentRecord,
    Phase,
    PhaseName,
    StoredEvent,
)
from service.journaldb import plan, rows
from service.journaldb.schema import MIGRATIONS, SCHEMA_VERSION
from service.journaldb.walcheckpoint import WalCheckpointer

#: Statuses after which an action gets its ``finished`` stamp.
FINAL_STATUSES = frozenset(
    {ActionStatus.done, ActionStatus.failed, ActionStatus.expired, ActionStatus.skipped}
)
#: How long a connection waits for a lock held by another process, in milliseconds.
BUSY_TIMEOUT_MS = 10_000


class SqliteJournal:
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
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
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

    # --- events ----------------------------------------------------------------------------

    def append_events(self, events: Sequence[HealthEvent], received: Stamp) -> list[bool]:
        """Commit ``events`` in one transaction; True for each new id, False for a duplicate
        (of an earlier event or of one earlier in ``events``; the first copy stays)."""
        if not events:
            return []
        with self._write("append events") as c:
            # One lookup of the ids already stored, then one executemany of the rest: a
            # Python loop of single INSERTs costs several times more per event. The
            # transaction (BEGIN IMMEDIATE) keeps other writers out between the two.
            seen = plan.stored_ids(c, [e.id for e in events])
            new: list[bool] = []
            rows = []
            for e in events:
                fresh = e.id not in seen
                new.append(fresh)
                if fresh:
                    seen.add(e.id)
                    rows.append((e.id, e.node, e.model_dump_json(), received.wall, received.mono))
            c.executemany(
                "INSERT INTO events(id, node, body, received_wall, received_mono) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        return new

    def undecided(self) -> list[StoredEvent]:
        """Events committed but not yet decided, in arrival order."""
        with self._read("read undecided events") as c:
            cur = c.execute(
                f"SELECT {rows.EVENT_COLUMNS} FROM events WHERE decided = 0 ORDER BY seq"  # noqa: S608
            )
            return [rows.stored_event(r) for r in cur]

    def events_by_id(self, ids: Sequence[str]) -> list[StoredEvent]:
        """The stored events among ``ids`` (unknown ids are left out), in arrival order."""
        found: list[StoredEvent] = []
        with self._read("read events") as c:
            for start in range(0, len(ids), plan.CHUNK):
                chunk = list(ids[start : start + plan.CHUNK])
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT {rows.EVENT_COLUMNS} FROM events WHERE id IN ({marks})"  # noqa: S608
                found.extend(rows.stored_event(r) for r in c.execute(sql, chunk))
        return sorted(found, key=lambda s: s.seq)

    def history(self) -> list[tuple[StoredEvent, Decision | None]]:
        """Every event in arrival order with its decision (None if undecided)."""
        with self._read("read history") as c:
            cur = c.execute(
                f"SELECT {rows.EVENT_COLUMNS}, d.body FROM events "  # noqa: S608
                "LEFT JOIN decisions d ON d.event_id = events.id ORDER BY seq"
            )
            return [
                (rows.stored_event(r[:-1]), rows.decision(r[-1]) if r[-1] else None) for r in cur
            ]

    # --- decisions and actions -------------------------------------------------------------

    def record_decision(self, decision: Decision, at: Stamp) -> list[ActionRecord]:
        """In one transaction: store ``decision``, mark its event decided, open or join its
        incident (phase ``decided``; the incident's verdict rises to the decision's if higher)
        and plan its actions (``held`` when the decision is held, else ``planned``).

        Recording a decision for an event already decided changes nothing and returns that
        decision's actions (a restarted engine may decide again). Raises JournalError for an
        event that is not in the journal, or for actions without an incident.
        """
        with self._write("record decision") as c:
            row = c.execute(
                "SELECT decided FROM events WHERE id = ?", (decision.event_id,)
            ).fetchone()
            if row is None:
                raise JournalError(
                    f"decision for event {decision.event_id!r}, which is not in the journal: "
                    "append the event first"
                )
            if row[0]:
                cur = c.execute(
                    f"SELECT {rows.ACTION_COLUMNS} FROM actions WHERE event_id = ? ORDER BY id",  # noqa: S608
                    (decision.event_id,),
                )
                return [rows.action(r) for r in cur]
            if decision.incident is None and decision.actions:
                raise JournalError(
                    f"decision for event {decision.event_id!r} plans actions but names no incident"
                )
            if decision.incident is not None:
                plan.open_or_join(c, decision, at)
            c.execute(
                "INSERT INTO decisions(event_id, incident, body, at_wall, at_mono) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    decision.event_id,
                    decision.incident,
                    json.dumps(decision.to_json()),
                    at.wall,
                    at.mono,
                ),
            )
            c.execute("UPDATE events SET decided = 1 WHERE id = ?", (decision.event_id,))
            return plan.plan_actions(c, decision, at)

    def record_outcome(
        self,
        action_id: int,
        status: ActionStatus,
        at: Stamp,
        *,
        detail: str = "",
        attempts: int = 1,
    ) -> None:
        """Set the action's status, detail and attempt count; a final status (done, failed,
        expired, skipped) also stamps ``finished`` with ``at``. Raises JournalError for an
        unknown action id."""
        status = ActionStatus(status)
        final = status in FINAL_STATUSES
        with self._write("record outcome") as c:
            cur = c.execute(
                "UPDATE actions SET status = ?, detail = ?, attempts = ?, "
                "finished_wall = ?, finished_mono = ? WHERE id = ?",
                (
                    status.value,
                    detail,
                    attempts,
                    at.wall if final else None,
                    at.mono if final else None,
                    action_id,
                ),
            )
            if cur.rowcount != 1:
                raise JournalError(f"no action with id {action_id} in the journal")

    def pending_actions(self) -> list[ActionRecord]:
        """Actions ``planned`` or ``waiting``, in the order they were planned."""
        return self._actions_with("status IN ('planned', 'waiting')")

    def held_actions(self) -> list[ActionRecord]:
        """Actions the breaker holds, oldest first."""
        return self._actions_with("status = 'held'")

    def _actions_with(self, where: str) -> list[ActionRecord]:
        with self._read("read actions") as c:
            cur = c.execute(f"SELECT {rows.ACTION_COLUMNS} FROM actions WHERE {where} ORDER BY id")  # noqa: S608
            return [rows.action(r) for r in cur]

    # --- incidents -------------------------------------------------------------------------

    def add_phase(self, incident: str, phase: Phase) -> bool:
        """Record a phase; False when that name was already recorded (the first instant is
        kept). Raises UsageError for an unknown incident."""
        with self._write("add phase") as c:
            rows.require_incident(c, incident)
            return self._add_phase(c, incident, phase)

    @staticmethod
    def _add_phase(c: sqlite3.Connection, incident: str, phase: Phase) -> bool:
        cur = c.execute(
            "INSERT OR IGNORE INTO phases(incident, name, wall, mono, detail) "
            "VALUES (?, ?, ?, ?, ?)",
            (incident, phase.name.value, phase.at.wall, phase.at.mono, phase.detail),
        )
        return cur.rowcount == 1

    def update_incident(
        self,
        incident: str,
        *,
        jobs: Sequence[str] | None = None,
        info: IncidentInfo | None = None,
    ) -> None:
        """Replace the incident's job list and/or merge ``info`` into its facts (key by key;
        keys already stored that ``info`` does not name are kept). Raises UsageError for an
        unknown incident."""
        with self._write("update incident") as c:
            rows.require_incident(c, incident)
            if jobs is not None:
                c.execute(
                    "UPDATE incidents SET jobs = ? WHERE id = ?",
                    (json.dumps([str(j) for j in jobs]), incident),
                )
            if info:
                (old,) = c.execute(
                    "SELECT info FROM incidents WHERE id = ?", (incident,)
                ).fetchone()
                merged = {**json.loads(old), **info}
                c.execute(
                    "UPDATE incidents SET info = ? WHERE id = ?", (json.dumps(merged), incident)
                )

    def close_incident(self, incident: str, at: Stamp, detail: str = "") -> bool:
        """Close ``incident`` (phase ``closed``); False when it was closed already. Raises
        UsageError for an unknown incident."""
        with self._write("close incident") as c:
            rows.require_incident(c, incident)
            cur = c.execute(
                "UPDATE incidents SET status = 'closed', closed_wall = ?, closed_mono = ? "
                "WHERE id = ? AND status = 'open'",
                (at.wall, at.mono, incident),
            )
            if cur.rowcount == 0:
                return False
            self._add_phase(c, incident, Phase(PhaseName.closed, at, detail))
            return True

    def incidents(self, *, open_only: bool = False) -> list[IncidentRecord]:
        """Incidents, oldest first, with their phases, actions and event ids."""
        where = "status = 'open'" if open_only else "1 = 1"
        with self._read("read incidents") as c:
            return rows.load_incidents(c, where, ())

    def incident(self, incident: str) -> IncidentRecord:
        """One incident; an unknown id raises UsageError naming how to list them."""
        with self._read("read incident") as c:
            found = rows.load_incidents(c, "id = ?", (incident,))
        if not found:
            raise rows.unknown_incident(incident)
        return found[0]

    # --- meta ------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        """A small named value; None when unset."""
        with self._read("read meta") as c:
            row = c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a small named value (replacing any earlier one)."""
        with self._write("set meta") as c:
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))
