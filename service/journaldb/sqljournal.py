"""The journal port's methods, on any SQL database the project supports: :class:`SqlJournal`.
Its subclasses own the connections and transactions:
:class:`~service.journaldb.journal.SqliteJournal` (one file, the embedded default) and
:class:`~service.journaldb.pgjournal.PostgresJournal` (a server, for coordinator replicas on
several machines).

The SQL is written once, in the dialect both accept: ``?`` parameters (the PostgreSQL
connection translates them), ``INSERT ... ON CONFLICT``, ``RETURNING``, and ``rowid`` for
insertion order (SQLite's own; a ``BIGSERIAL`` column of that name on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager

from recovery.errors import JournalError
from recovery.model import Decision, HealthEvent
from recovery.ports.clock import Stamp
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
from service.journaldb.rows import Sql

#: Statuses after which an action gets its ``finished`` stamp.
FINAL_STATUSES = frozenset(
    {ActionStatus.done, ActionStatus.failed, ActionStatus.expired, ActionStatus.skipped}
)


class SqlJournal:
    """The :class:`recovery.ports.journal.Journal` port over :meth:`_write` and :meth:`_read`
    transactions a subclass provides."""

    def _write(self, what: str) -> AbstractContextManager[Sql]:
        """One write transaction, committed (durably) on exit; inside a :meth:`batch`, a
        savepoint of the batch's transaction. Errors: JournalError."""
        raise NotImplementedError

    def _read(self, what: str) -> AbstractContextManager[Sql]:
        """One read transaction: one consistent snapshot. Errors: JournalError."""
        raise NotImplementedError

    def batch(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def close(self) -> None:
        """Close every connection. Idempotent; any later call raises JournalError."""
        raise NotImplementedError

    def _lock_events(self, c: Sql) -> None:
        """Keep other writers (other processes) from appending events until the end of this
        write transaction."""

    # --- events ----------------------------------------------------------------------------

    def append_events(self, events: Sequence[HealthEvent], received: Stamp) -> list[bool]:
        """Commit ``events`` in one transaction; True for each new id, False for a duplicate
        (of an earlier event or of one earlier in ``events``; the first copy stays)."""
        if not events:
            return []
        with self._write("append events") as c:
            # One lookup of the ids already stored, then one executemany of the rest: a
            # Python loop of single INSERTs costs several times more per event. The
            # transaction keeps other writers out between the two (SQLite: BEGIN IMMEDIATE;
            # PostgreSQL: a lock on the table, which also keeps arrival order = seq order).
            self._lock_events(c)
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
    def _add_phase(c: Sql, incident: str, phase: Phase) -> bool:
        cur = c.execute(
            "INSERT INTO phases(incident, name, wall, mono, detail) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
            c.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
