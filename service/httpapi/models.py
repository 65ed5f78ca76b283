"""The HTTP API's response bodies as pydantic models (what the OpenAPI document shows), and
their construction from the journal's records."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from recovery.model import HealthEvent
from recovery.ports.clock import Stamp
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    IncidentRecord,
    IncidentStatus,
    Phase,
    PhaseName,
    StoredEvent,
)


class IntakeReply(BaseModel):
    """What ``POST /v1/events`` answers once the events are durable."""

    accepted: list[str]
    """Ids stored by this request."""
    duplicates: list[str]
    """Ids already in the journal (or repeated in this request): acknowledged, not stored
    again."""


class ErrorReply(BaseModel):
    detail: str


class FieldError(BaseModel):
    loc: list[str | int]
    """Where the problem is: ``["body", "events", 3, "fault"]``."""
    msg: str
    type: str


class ValidationReply(BaseModel):
    detail: list[FieldError]


class StampOut(BaseModel):
    wall: float
    """Unix seconds."""
    mono: float
    """CLOCK_MONOTONIC seconds on the coordinator."""


class PhaseOut(BaseModel):
    name: PhaseName
    at: StampOut
    detail: str


class ActionOut(BaseModel):
    id: int
    incident: str
    kind: str
    action: dict[str, Any]
    """The action's parameters (``Action.to_json``: kind, node and the rest)."""
    status: ActionStatus
    attempts: int
    detail: str
    planned: StampOut | None
    finished: StampOut | None


class StoredEventOut(BaseModel):
    seq: int
    event: HealthEvent
    received: StampOut
    decided: bool


class IncidentOut(BaseModel):
    id: str
    node: str
    fault: str
    verdict: str
    status: IncidentStatus
    opened: StampOut
    closed: StampOut | None
    event_ids: list[str]
    jobs: list[str]
    info: dict[str, Any]
    """The incident's facts (:class:`recovery.ports.journal.IncidentInfo`): ``job_restarts``,
    ``path``, ``save``, ``spare``, ``spare_rechosen``."""
    phases: list[PhaseOut]
    actions: list[ActionOut]


class IncidentDetail(IncidentOut):
    events: list[StoredEventOut]
    """The events that opened or joined the incident, in arrival order."""


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    role: Literal["single", "leader", "standby"] = "single"
    """``single``: the only coordinator; else one replica of several (``--lease``)."""
    replica: str | None = None
    """This replica's identity in the lease."""
    leader: str | None = None
    """The replica that leads, as this one last saw the lease ("" when none)."""
    term: int | None = None


def stamp_out(s: Stamp | None) -> StampOut | None:
    return None if s is None else StampOut(wall=s.wall, mono=s.mono)


def _stamp(s: Stamp) -> StampOut:
    return StampOut(wall=s.wall, mono=s.mono)


def phase_out(p: Phase) -> PhaseOut:
    return PhaseOut(name=p.name, at=_stamp(p.at), detail=p.detail)


def action_out(a: ActionRecord) -> ActionOut:
    return ActionOut(
        id=a.id,
        incident=a.incident,
        kind=a.action.kind,
        action=a.action.to_json(),
        status=a.status,
        attempts=a.attempts,
        detail=a.detail,
        planned=stamp_out(a.planned),
        finished=stamp_out(a.finished),
    )


def incident_out(r: IncidentRecord) -> IncidentOut:
    return IncidentOut(
        id=r.id,
        node=r.node,
        fault=r.fault,
        verdict=r.verdict,
        status=r.status,
        opened=_stamp(r.opened),
        closed=stamp_out(r.closed),
        event_ids=list(r.event_ids),
        jobs=list(r.jobs),
        info=dict(r.info),
        phases=[phase_out(p) for p in r.phases],
        actions=[action_out(a) for a in r.actions],
    )


def incident_detail(r: IncidentRecord, events: list[StoredEvent]) -> IncidentDetail:
    return IncidentDetail(
        **incident_out(r).model_dump(),
        events=[
            StoredEventOut(seq=s.seq, event=s.event, received=_stamp(s.received), decided=s.decided)
            for s in events
        ],
    )


class CheckRequest(BaseModel):
    """``POST /v1/nodes/{node}/check``: ``burn_in`` false runs the cheap checks only (null:
    as the policy says); ``force`` records an operator's passing verdict with their reason
    instead of checking."""

    model_config = ConfigDict(extra="forbid")

    burn_in: bool | None = None
    force: Annotated[str, Field(min_length=1, max_length=200)] | None = None
