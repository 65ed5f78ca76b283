"""``recover report DIR``: rebuild a run directory's report (``report.json``, ``report.md``,
``timeline.png``) from its journal excerpt and event log, and print the table. A run started
by hand (only its event logs) is reported from its events alone.

Register with ``report.register(app)`` in :mod:`recover`. matplotlib is imported only
when the command runs, so ``recover --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def report(
    directory: Annotated[
        Path,
        typer.Argument(
            help="Run directory: a scenario run's (run.json, incidents.json, events.jsonl), "
            "or any training run's (events.jsonl, events.rank<r>.jsonl), reported from its "
            "events alone."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print report.json instead.")] = False,
) -> None:
    """Rebuild report.json, report.md and timeline.png in DIR; print each incident's phases
    (lost progress against replacement time), goodput and badput, and the timeline's path.

    A run started by hand (recover train, or a loop on recovery.api) has no run.json or
    incidents.json: its report tells what the job's events tell (runs, restarts, restores,
    checkpoints, steps recomputed, each restart's phases) and says what cannot be known
    without the scenario runner's files (injected faults, incidents, the journal's phases)."""
    from recovery.report.table import render_table
    from service.reportgen import REPORT_JSON, REPORT_MD, TIMELINE_PNG, write_report

    built = write_report(directory)
    files = {name: str(directory / name) for name in (REPORT_JSON, REPORT_MD, TIMELINE_PNG)}
    if as_json:
        typer.echo(json.dumps({**built.to_json(), "files": files}, indent=2))
    else:
        typer.echo(render_table(built, files[TIMELINE_PNG]))


def register(app: typer.Typer) -> None:
    """Add ``recover report`` to ``app``."""
    app.command("report")(report)
