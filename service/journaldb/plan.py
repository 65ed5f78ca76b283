"""The write side of deciding, on an open write transaction: which ids are stored already,
opening or joining an incident, planning a decision's actions."""

from __future__ import annotations

import json
from collections.abc import Sequence

from recovery.model import Decision, Verdict
from recovery.ports.clock import Stamp
from recovery.ports.journal import ActionRecord, ActionStatus, IncidentStatus, PhaseName
from service.journaldb.rows import Sql

#: Ids per ``IN (...)`` query: SQLite allows 999 parameters in older builds.
CHUNK = 500


def stored_ids(c: Sql, ids: Sequence[str]) -> set[str]:
    """Those of ``ids`` already in the events table."""
    found: set[str] = set()
    for start in range(0, len(ids), CHUNK):  # stay under SQLite's parameter limit
        chunk = ids[start : start + CHUNK]
        sql = f"SELECT id FROM events WHERE id IN ({','.join('?' * len(chunk))})"  # noqa: S608
        found.update(row[0] for row in c.execute(sql, chunk))
    return found


def open_or_join(c: Sql, decision: Decision, at: Stamp) -> None:
    """Create the decision's incident, or raise the existing one's verdict if this one is
    worse; record its ``decided`` phase (kept from the first decision)."""
    incident = decision.incident
    row = c.execute("SELECT verdict FROM incidents WHERE id = ?", (incident,)).fetchone()
    if row is None:
        c.execute(
            "INSERT INTO incidents(id, node, fault, verdict, status, opened_wall, "
            "opened_mono) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                incident,
                decision.node,
                decision.fault,
                decision.verdict.value,
                IncidentStatus.open.value,
                at.wall,
                at.mono,
            ),
        )
    elif Verdict(row[0]).rank < decision.verdict.rank:
        c.execute(
            "UPDATE incidents SET verdict = ? WHERE id = ?", (decision.verdict.value, incident)
        )
    c.execute(
        "INSERT INTO phases(incident, name, wall, mono, detail) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT DO NOTHING",
        (incident, PhaseName.decided.value, at.wall, at.mono, decision.why),
    )


def plan_actions(c: Sql, decision: Decision, at: Stamp) -> list[ActionRecord]:
    """Insert the decision's actions in order (held when the decision is held) and return
    their records."""
    status = ActionStatus.held if decision.held else ActionStatus.planned
    planned: list[ActionRecord] = []
    for position, action in enumerate(decision.actions):
        (action_id,) = c.execute(
            "INSERT INTO actions(incident, event_id, position, body, status, "
            "planned_wall, planned_mono) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                decision.incident,
                decision.event_id,
                position,
                json.dumps(action.to_json()),
                status.value,
                at.wall,
                at.mono,
            ),
        ).fetchone()
        planned.append(
            ActionRecord(
                id=int(action_id),
                incident=str(decision.incident),
                action=action,
                status=status,
                planned=at,
            )
        )
    return planned
