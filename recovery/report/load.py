"""``load_run``: any run directory, the scenario runner's or one left by a run started by
hand, read into one :class:`~recovery.report.run.RunRecord`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from recovery.progress.stacks import taken_at
from recovery.report.byhand import load_hand_run
from recovery.report.run import (
    RUN_FILE,
    RunDirError,
    RunRecord,
    SupervisorEntry,
    load_scenario_run,
)


def load_run(directory: Path) -> RunRecord:
    """Read the run in ``directory``: with ``run.json``, the scenario runner's three files
    (:func:`~recovery.report.run.load_scenario_run`); without it, the event logs of a run
    started by hand (:func:`~recovery.report.byhand.load_hand_run`).

    Raises:
        RunDirError: ``directory`` is not a directory; a file is missing, unreadable or
            malformed (the message names the file, the place in it and the field); there is
            no event log at all (the message names the files expected).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise RunDirError(f"{directory} is not a directory (give the run directory to report on)")
    if (directory / RUN_FILE).exists():
        record = load_scenario_run(directory)
    else:
        record = load_hand_run(directory)
    return replace(
        record, stacks_at=stacks_taken(directory), supervisor=supervisor_entries(directory)
    )


#: Where a stalled job's stacks are kept, from a report's directory: a scenario run's job
#: folder, or the run directory itself (``<progress folder>/stacks``, written by the agents).
STACKS_DIRS = ("job/progress/stacks", "progress/stacks")


def stacks_taken(directory: Path) -> tuple[float, ...]:
    """When the agents took each of the stacks kept under ``directory``, sorted; unreadable
    files are skipped."""
    times = [taken_at(path) for sub in STACKS_DIRS for path in (directory / sub).glob("rank*.txt")]
    return tuple(sorted(t for t in times if t is not None))


#: Where an in-allocation job's supervisor journal is, from a report's directory (the job's
#: submit directory: a scenario run's directory, or its job folder).
SUPERVISOR_GLOBS = ("supervisor-*.jsonl", "job/supervisor-*.jsonl")


def supervisor_entries(directory: Path) -> tuple[SupervisorEntry, ...]:
    """Every supervisor journal's entries under ``directory``, in time order. The journal is
    the supervisor's own account, beside the run's records: a line that is not a JSON object
    with ``event`` and ``unix`` (one cut short by a kill) is skipped, not refused."""
    out: list[SupervisorEntry] = []
    for pattern in SUPERVISOR_GLOBS:
        for path in sorted(directory.glob(pattern)):
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(doc, dict):
                    continue
                event, at = doc.get("event"), doc.get("unix")
                if isinstance(event, str) and isinstance(at, int | float):
                    out.append(SupervisorEntry(event, float(at), doc))
    return tuple(sorted(out, key=lambda e: e.at))
