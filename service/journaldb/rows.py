"""Rows of the journal's tables to the port's records, and back (pure, no transactions).

SQL here and in :mod:`service.journaldb.journal` is assembled only from this package's own
constant fragments (column lists, fixed WHERE clauses); every value goes through ``?``
parameters, hence the ``noqa: S608`` marks.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from recovery.errors import UsageError
from recovery.model import Decision, HealthEvent, action_from_json
from recovery.ports.clock import Stamp
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    IncidentRecord,
    IncidentStatus,
    Phase,
    PhaseName,
    StoredEvent,
    incident_info,
)


class Rows(Protocol):
    """What a statement returns (a sqlite3 or psycopg cursor)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class Sql(Protocol):
    """A connection inside a transaction, as the journal's SQL uses it: ``?`` parameters."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Rows: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...


EVENT_COLUMNS = "seq, events.body, received_wall, received_mono, decided"
ACTION_COLUMNS = (
    "id, incident, body, status, attempts, detail, planned_wall, planned_mono, "
    "finished_wall, finished_mono"
)
_INCIDENT_COLUMNS = (
    "id, node, fault, verdict, status, opened_wall, opened_mono, closed_wall, closed_mono, "
    "jobs, info"
)


def stamp(wall: float | None, mono: float | None) -> Stamp | None:
    return None if wall is None or mono is None else Stamp(wall, mono)


def stored_event(row: tuple[Any, ...]) -> StoredEvent:
    seq, body, wall, mono, decided = row
    return StoredEvent(
        seq=seq,
        event=HealthEvent.model_validate_json(body),
        received=Stamp(wall, mono),
        decided=bool(decided),
    )


def decision(body: str) -> Decision:
    return Decision.from_json(json.loads(body))


def action(row: tuple[Any, ...]) -> ActionRecord:
    aid, incident, body, status, attempts, detail, pw, pm, fw, fm = row
    return ActionRecord(
        id=aid,
        incident=incident,
        action=action_from_json(json.loads(body)),
        status=ActionStatus(status),
        attempts=attempts,
        detail=detail,
        planned=stamp(pw, pm),
        finished=stamp(fw, fm),
    )


def unknown_incident(incident: str) -> UsageError:
    return UsageError(
        f"Unknown incident {incident!r}. List them with `recover incidents` (GET /v1/incidents)."
    )


def require_incident(c: Sql, incident: str) -> None:
    """Raise UsageError unless ``incident`` exists."""
    if c.execute("SELECT 1 FROM incidents WHERE id = ?", (incident,)).fetchone() is None:
        raise unknown_incident(incident)


def load_incidents(c: Sql, where: str, args: tuple[Any, ...]) -> list[IncidentRecord]:
    """Incidents matching ``where`` (SQL over the incidents table, with ``args``), oldest
    first, with their phases, actions and event ids: four queries, not four per incident."""
    chosen = f"SELECT id FROM incidents WHERE {where}"  # noqa: S608
    phases: dict[str, list[Phase]] = defaultdict(list)
    for inc, name, wall, mono, detail in c.execute(
        f"SELECT incident, name, wall, mono, detail FROM phases WHERE incident IN ({chosen}) "  # noqa: S608
        "ORDER BY rowid",
        args,
    ):
        phases[inc].append(Phase(PhaseName(name), Stamp(wall, mono), detail))
    actions: dict[str, list[ActionRecord]] = defaultdict(list)
    for row in c.execute(
        f"SELECT {ACTION_COLUMNS} FROM actions WHERE incident IN ({chosen}) ORDER BY id",  # noqa: S608
        args,
    ):
        actions[row[1]].append(action(row))
    event_ids: dict[str, list[str]] = defaultdict(list)
    for inc, eid in c.execute(
        "SELECT d.incident, d.event_id FROM decisions d JOIN events e ON e.id = d.event_id "  # noqa: S608
        f"WHERE d.incident IN ({chosen}) ORDER BY e.seq",
        args,
    ):
        event_ids[inc].append(eid)
    found = []
    for row in c.execute(
        f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE {where} ORDER BY rowid",  # noqa: S608
        args,
    ):
        iid, node, fault, verdict, status, ow, om, cw, cm, jobs, info = row
        found.append(
            IncidentRecord(
                id=iid,
                node=node,
                fault=fault,
                verdict=verdict,
                status=IncidentStatus(status),
                opened=Stamp(ow, om),
                closed=stamp(cw, cm),
                event_ids=tuple(event_ids[iid]),
                phases=tuple(phases[iid]),
                actions=tuple(actions[iid]),
                jobs=tuple(json.loads(jobs)),
                info=incident_info(json.loads(info)),
            )
        )
    return found
