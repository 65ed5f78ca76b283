"""A run directory read back: ``run.json``, ``incidents.json`` and ``events.jsonl`` (with
``events.rank<r>.jsonl`` for the other processes of a K-process job).

The scenario runner writes these three files (the layout is in :mod:`recovery.report`);
``recover report DIR`` reads them again, so every field is checked here once and a broken file
is answered with its name, the place in it and the field that is wrong.

A run started by hand has only its event logs: :mod:`recovery.report.byhand` reads it into the
same :class:`RunRecord`, and :func:`recovery.report.load.load_run` chooses between the two.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.errors import UsageError
from recovery.events import EVENTS
from recovery.ports.journal import IncidentInfo, PhaseName, incident_info

RUN_FILE = "run.json"
INCIDENTS_FILE = "incidents.json"
EVENTS_FILE = "events.jsonl"
#: The only run.json format this reader knows.
FORMAT = 1


class RunDirError(UsageError):
    """A run directory lacks one of its files, or one of them is malformed; the message names
    the file, where in it, and the field."""


@dataclass(frozen=True)
class Fault:
    """One fault the runner injected."""

    fault: str
    node: str
    via: str
    at: float
    """Wall seconds when it was injected."""


@dataclass(frozen=True)
class Job:
    """The training job the run watched."""

    id: str
    """Slurm's job id; ``""`` when not known (a run outside Slurm, without run.json)."""
    nodes: tuple[str, ...]
    steps: int | None
    """The step it trains to; None when not known (no run.json, no ``target_steps``)."""
    save_every: int | None
    """Steps between checkpoints; None when not known (no run.json, no ``save_every``)."""
    model: str
    run_dir: str
    processes: int = 1
    """Training processes of the job, one per node (run.json before it: one)."""

    @property
    def label(self) -> str:
        """``job <id>``, or ``job`` when the id is not known."""
        return f"job {self.id}" if self.id else "job"


@dataclass(frozen=True)
class PhaseMark:
    """One named instant of an incident (``decided``, ``node-down``, ...), wall seconds.
    ``name`` is kept as the file has it: a phase this version does not know is shown, not
    refused."""

    name: str
    at: float
    detail: str


@dataclass(frozen=True)
class ActionEntry:
    """One journaled action: what was planned and what became of it."""

    kind: str
    node: str
    status: str
    detail: str
    params: dict[str, Any]
    """The action's own fields (``reason`` for a take-down or drain)."""
    planned: float | None
    finished: float | None


@dataclass(frozen=True)
class Incident:
    """One incident as ``GET /v1/incidents/{id}`` returns it, checked and typed."""

    id: str
    node: str
    fault: str
    verdict: str
    status: str
    opened: float
    closed: float | None
    jobs: tuple[str, ...]
    info: IncidentInfo
    phases: tuple[PhaseMark, ...]
    actions: tuple[ActionEntry, ...]

    def first(self, *names: PhaseName) -> PhaseMark | None:
        """The earliest phase with one of ``names``, or None."""
        found = [p for p in self.phases if p.name in names]
        return min(found, key=lambda p: p.at) if found else None


@dataclass(frozen=True)
class SupervisorEntry:
    """One line of an in-allocation job's supervisor journal (``supervisor-<job>.jsonl``):
    ``stalled``, ``stacks``, ``step-ended``, ``relaunch``, ``slow``, ``launched`` ...;
    ``data`` holds the whole record."""

    event: str
    at: float
    data: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Event:
    """One line of ``events.jsonl``; ``data`` holds the whole record."""

    line: int
    kind: str
    ts: float
    step: int | None
    data: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class RunRecord:
    """Everything a report is built from."""

    directory: Path
    scenario: str
    started: float
    finished: float
    """Wall seconds the run began and ended."""
    nodes: tuple[str, ...]
    """Nodes in service when it began."""
    spares: tuple[str, ...]
    job: Job
    faults: tuple[Fault, ...]
    control_digest: str | None
    final_digest: str | None
    notes: tuple[str, ...]
    incidents: tuple[Incident, ...]
    events: tuple[Event, ...]
    """Process 0's events (``events.jsonl``; the only process of a one-process job)."""
    rank_events: tuple[tuple[Event, ...], ...] = ()
    """The events of processes 1..K-1 (``events.rank<r>.jsonl``), in rank order; a rank
    whose file is missing has none."""
    missing: tuple[str, ...] = ()
    """The scenario runner's files the directory lacks (:data:`RUN_FILE`,
    :data:`INCIDENTS_FILE`): a run started by hand, read from its events."""
    stacks_at: tuple[float, ...] = ()
    """When the agents took the stacks of a stalled job's processes (wall seconds, one per
    file of ``progress/stacks``; :func:`recovery.report.load.stacks_taken`)."""
    supervisor: tuple[SupervisorEntry, ...] = ()
    """What the job's in-allocation supervisor journaled, in time order (none for a job on
    the requeue path; :func:`recovery.report.load.supervisor_entries`)."""

    def supervised(
        self, event: str, after: float, before: float | None = None
    ) -> SupervisorEntry | None:
        """The supervisor's first ``event`` at or after ``after`` (and before ``before``)."""
        return next(
            (
                e
                for e in self.supervisor
                if e.event == event and e.at >= after and (before is None or e.at < before)
            ),
            None,
        )

    @property
    def ranks(self) -> tuple[tuple[Event, ...], ...]:
        """Every process's events, by rank: process 0's first."""
        return (self.events, *self.rank_events)


class _Fields:
    """Typed access to one JSON object; errors name the file, the place and the field."""

    def __init__(self, doc: Any, where: str) -> None:
        if not isinstance(doc, dict):
            raise RunDirError(f"{where}: expected a JSON object, found {type(doc).__name__}")
        self.doc: dict[str, Any] = doc
        self.where = where

    def _get(self, key: str, kinds: tuple[type, ...], what: str, optional: bool) -> Any:
        if key not in self.doc:
            if optional:
                return None
            raise RunDirError(f"{self.where}: field {key!r} is missing ({what})")
        value = self.doc[key]
        if value is None and optional:
            return None
        # bool is an int to Python; a true/false where a number belongs is still wrong.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise RunDirError(
                f"{self.where}: field {key!r} must be {what}, found {json.dumps(value)[:60]}"
            )
        return value

    def text(self, key: str, *, optional: bool = False) -> Any:
        return self._get(key, (str,), "a string", optional)

    def number(self, key: str, *, optional: bool = False) -> Any:
        v = self._get(key, (int, float), "a number (seconds)", optional)
        return None if v is None else float(v)

    def integer(self, key: str, *, optional: bool = False) -> Any:
        return self._get(key, (int,), "an integer", optional)

    def items(self, key: str) -> list[Any]:
        value: list[Any] = self._get(key, (list,), "a list", False)
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        values = self.items(key)
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise RunDirError(f"{self.where}: {key}[{i}] must be a string, found {v!r}")
        return tuple(values)

    def obj(self, key: str, *, optional: bool = False) -> _Fields:
        value = self._get(key, (dict,), "an object", optional)
        return _Fields({} if value is None else value, f"{self.where} {key}")

    def stamp(self, key: str, *, optional: bool = False) -> float | None:
        """A ``{"wall": s, "mono": s}`` stamp's wall seconds (or a bare number)."""
        value = self.doc.get(key)
        if value is None and optional:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        wall: float = self.obj(key).number("wall")
        return wall


def read_json(directory: Path, name: str) -> Any:
    """The JSON document ``directory/name``; RunDirError names the file when it is missing,
    unreadable or not JSON."""
    path = directory / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunDirError(
            f"{path} is missing: a run directory holds {RUN_FILE}, {INCIDENTS_FILE} and "
            f"{EVENTS_FILE}"
        ) from None
    except OSError as e:
        raise RunDirError(f"{path} cannot be read: {e}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path} is not valid JSON: {e}") from e


def _fault(doc: Any, where: str) -> Fault:
    f = _Fields(doc, where)
    return Fault(fault=f.text("fault"), node=f.text("node"), via=f.text("via"), at=f.number("at"))


def _job(f: _Fields) -> Job:
    return Job(
        id=str(f.doc["id"]) if isinstance(f.doc.get("id"), int) else f.text("id"),
        nodes=f.texts("nodes"),
        steps=f.integer("steps"),
        save_every=f.integer("save_every"),
        model=f.text("model"),
        run_dir=f.text("run_dir"),
        processes=f.integer("processes") if "processes" in f.doc else 1,
    )


def _action(doc: Any, where: str) -> ActionEntry:
    f = _Fields(doc, where)
    params = f.obj("action")
    return ActionEntry(
        kind=params.text("kind"),
        node=params.text("node"),
        status=f.text("status"),
        detail=f.text("detail", optional=True) or "",
        params=dict(params.doc),
        planned=f.stamp("planned", optional=True),
        finished=f.stamp("finished", optional=True),
    )


def _incident(doc: Any, where: str) -> Incident:
    f = _Fields(doc, where)
    ident = f.text("id")
    f.where = f"{where} ({ident})"
    phases = []
    for i, p in enumerate(f.items("phases")):
        pf = _Fields(p, f"{f.where} phases[{i}]")
        at = pf.stamp("at")
        assert at is not None  # not optional: stamp() raised otherwise
        phases.append(PhaseMark(pf.text("name"), at, pf.text("detail", optional=True) or ""))
    actions = [_action(a, f"{f.where} actions[{i}]") for i, a in enumerate(f.items("actions"))]
    opened = f.stamp("opened")
    assert opened is not None
    return Incident(
        id=ident,
        node=f.text("node"),
        fault=f.text("fault"),
        verdict=f.text("verdict"),
        status=f.text("status"),
        opened=opened,
        closed=f.stamp("closed", optional=True),
        jobs=tuple(str(j) for j in f.items("jobs")),
        info=incident_info(f.obj("info", optional=True).doc),
        phases=tuple(sorted(phases, key=lambda p: p.at)),
        actions=tuple(actions),
    )


def parse_incidents(doc: Any, where: str = INCIDENTS_FILE) -> tuple[Incident, ...]:
    """Incidents from the JSON list ``recover incidents ID --json`` gives, one per element.

    Raises RunDirError naming the element and the field when one is malformed.
    """
    if not isinstance(doc, list):
        raise RunDirError(f"{where}: expected a JSON list of incidents, found {type(doc).__name__}")
    return tuple(_incident(d, f"{where}: incident {i}") for i, d in enumerate(doc))


def _event(doc: Any, line: int, where: str) -> Event:
    f = _Fields(doc, where)
    kind = f.text("event")
    if kind not in EVENTS:
        known = ", ".join(sorted(EVENTS))
        raise RunDirError(f"{f.where}: unknown event {kind!r}. Known: {known}")
    step = f.integer("step", optional=True)
    if kind in ("step", "restored", "checkpoint") and step is None:
        raise RunDirError(f"{f.where}: a {kind!r} event needs field 'step' (an integer)")
    return Event(line=line, kind=kind, ts=f.number("ts"), step=step, data=f.doc)


def parse_events(lines: Sequence[str], where: str = EVENTS_FILE) -> tuple[Event, ...]:
    """Events from the lines of ``events.jsonl``; a torn last line (no newline: its writer was
    killed mid-write) is skipped, as :func:`recovery.events.read_events` does.

    Raises RunDirError naming the line and the field for anything else malformed.
    """
    events = []
    for n, line in enumerate(lines, start=1):
        if not line.endswith("\n") and n == len(lines):
            break
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunDirError(f"{where} line {n} is not valid JSON: {e}") from e
        events.append(_event(doc, n, f"{where} line {n}"))
    return tuple(events)


def event_records(records: Iterable[Any], where: str = EVENTS_FILE) -> tuple[Event, ...]:
    """Events from records already decoded (one JSON object per line, as
    :func:`recovery.events.read_events` yields them), checked as :func:`parse_events` checks
    lines; ``Event.line`` is the record's place, from 1.

    Raises RunDirError naming the record and the field for a malformed one.
    """
    return tuple(_event(r, n, f"{where} record {n}") for n, r in enumerate(records, start=1))


def parse_run(doc: Any, where: str = RUN_FILE) -> dict[str, Any]:
    """The fields of ``run.json`` as keyword arguments of :class:`RunRecord` (without the
    directory, the incidents and the events). Raises RunDirError for a malformed field."""
    f = _Fields(doc, where)
    fmt = f.integer("format")
    if fmt != FORMAT:
        raise RunDirError(f"{where}: format {fmt} is not known; this version reads {FORMAT}")
    cluster = f.obj("cluster")
    started, finished = f.number("started"), f.number("finished")
    if finished < started:
        raise RunDirError(f"{where}: 'finished' ({finished}) is before 'started' ({started})")
    return {
        "scenario": f.text("scenario"),
        "started": started,
        "finished": finished,
        "nodes": cluster.texts("nodes"),
        "spares": cluster.texts("spares"),
        "job": _job(f.obj("job")),
        "faults": tuple(_fault(d, f"{where} faults[{i}]") for i, d in enumerate(f.items("faults"))),
        "control_digest": f.text("control_digest", optional=True),
        "final_digest": f.text("final_digest", optional=True),
        "notes": f.texts("notes") if "notes" in f.doc else (),
    }


def load_scenario_run(directory: Path) -> RunRecord:
    """Read the scenario runner's run directory (``run.json``, ``incidents.json``,
    ``events.jsonl``, and ``events.rank<r>.jsonl`` for the other processes).

    Raises:
        RunDirError: a file is missing, unreadable or malformed; the message names the file,
            the place in it (element, line) and the field.
    """
    run = parse_run(read_json(directory, RUN_FILE), str(directory / RUN_FILE))
    incidents = parse_incidents(
        read_json(directory, INCIDENTS_FILE), str(directory / INCIDENTS_FILE)
    )
    path = directory / EVENTS_FILE
    events = parse_events(read_lines(path, required=True), str(path))
    ranks = []
    for rank in range(1, run["job"].processes):
        other = directory / f"events.rank{rank}.jsonl"
        ranks.append(parse_events(read_lines(other, required=False), str(other)))
    return RunRecord(
        directory=directory,
        incidents=incidents,
        events=events,
        rank_events=tuple(ranks),
        **run,
    )


def read_lines(path: Path, *, required: bool) -> list[str]:
    """The lines of an events file; [] for a missing one that is not ``required`` (a rank
    that never started writes none)."""
    try:
        with path.open(encoding="utf-8") as fh:
            return fh.readlines()
    except FileNotFoundError:
        if not required:
            return []
        raise RunDirError(f"{path} is missing (the training job's event log)") from None
    except OSError as e:
        raise RunDirError(f"{path} cannot be read: {e}") from e
