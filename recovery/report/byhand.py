"""A run started by hand, read back from its event logs alone.

``recover train --run-dir D`` and a loop of one's own on :mod:`recovery.api` leave
``D/events.jsonl`` (with ``events.rank<r>.jsonl`` for the other processes of a K-process
job) and ``D/checkpoints/``, but none of the scenario runner's files. The record is made from
the events: the run spans its first event to its last; the job's id and nodes come from the
Slurm context on the lines (``open_event_log`` adds it under Slurm), its target and checkpoint
interval from the latest ``started``; no fault is known to have been injected.
``incidents.json`` is read when present (a JSON list of what ``recover incidents ID --json``
prints for each incident); else no incident is known. :attr:`RunRecord.missing` names
the runner's files that were not there, so the report can say what it cannot know.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from recovery.events import EVENTS_FILE, event_files
from recovery.report.run import (
    INCIDENTS_FILE,
    RUN_FILE,
    Event,
    Incident,
    Job,
    RunDirError,
    RunRecord,
    parse_events,
    parse_incidents,
    read_json,
    read_lines,
)


def load_hand_run(directory: Path) -> RunRecord:
    """The record of the run in ``directory`` from its event logs (and ``incidents.json`` if
    there is one).

    Raises:
        RunDirError: ``events.jsonl`` is missing (the message names the files expected) or
            holds no event, or a file is malformed (named with the line and field).
    """
    files = event_files(directory)
    if 0 not in files:
        others = ", ".join(p.name for p in files.values())
        found = f"; found only {others}" if others else ""
        raise RunDirError(
            f"{directory} holds no event log: expected {EVENTS_FILE} (process 0's events, "
            "written by recover train or recovery.api's open_event_log; process r's in "
            f"events.rank<r>.jsonl) and, for a scenario run, {RUN_FILE} and "
            f"{INCIDENTS_FILE}{found}"
        )
    events = parse_events(read_lines(files[0], required=True), str(files[0]))
    if not events:
        raise RunDirError(f"{files[0]} holds no event: nothing to report on")
    count = max(max(files) + 1, _ranks_said(events))
    ranks = tuple(
        parse_events(read_lines(files[r], required=True), str(files[r])) if r in files else ()
        for r in range(1, count)
    )
    every = [e for rank in (events, *ranks) for e in rank]
    missing: tuple[str, ...] = (RUN_FILE,)
    incidents: tuple[Incident, ...] = ()
    if (directory / INCIDENTS_FILE).exists():
        doc = read_json(directory, INCIDENTS_FILE)
        incidents = parse_incidents(doc, str(directory / INCIDENTS_FILE))
    else:
        missing += (INCIDENTS_FILE,)
    nodes = tuple(dict.fromkeys(n for rank in (events, *ranks) if (n := _first_node(rank))))
    done = [e for e in events if e.kind == "completed"]
    digest = done[-1].data.get("state_digest") if done else None
    return RunRecord(
        directory=directory,
        scenario="",
        started=min(e.ts for e in every),
        finished=max(e.ts for e in every),
        nodes=nodes,
        spares=(),
        job=_job(events, nodes, directory, count),
        faults=(),
        control_digest=None,
        final_digest=digest if isinstance(digest, str) else None,
        notes=(),
        incidents=incidents,
        events=events,
        rank_events=ranks,
        missing=missing,
    )


def _ranks_said(events: Sequence[Event]) -> int:
    """The process count the lines carry (``ranks``); 1 when none does."""
    said = [e.data["ranks"] for e in events if isinstance(e.data.get("ranks"), int)]
    return max(said, default=1)


def _first_node(events: Sequence[Event]) -> str | None:
    """The node of a rank's first process (under Slurm every line names it)."""
    node = next((e.data["node"] for e in events if "node" in e.data), None)
    return node if isinstance(node, str) else None


def _job(events: Sequence[Event], nodes: tuple[str, ...], directory: Path, count: int) -> Job:
    """The job as process 0's lines tell it: the Slurm job id on its lines, the target and
    the checkpoint interval on its latest ``started`` (``recover train`` writes both; a loop
    of one's own may not)."""
    started = [e.data for e in events if e.kind == "started"]
    last = started[-1] if started else {}
    ids = [e.data["slurm_job_id"] for e in events if "slurm_job_id" in e.data]
    config = last.get("run_config")
    model = config.get("model") if isinstance(config, dict) else None

    def integer(key: str) -> int | None:
        value = last.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return Job(
        id=str(ids[0]) if ids else "",
        nodes=nodes,
        steps=integer("target_steps"),
        save_every=integer("save_every"),
        model=model if isinstance(model, str) else "",
        run_dir=str(directory),
        processes=count,
    )
