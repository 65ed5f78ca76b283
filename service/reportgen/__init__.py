"""The report's files: ``report.json``, ``report.md`` and ``timeline.png`` in a run directory.

Sits above the core (it draws with matplotlib, which the core may not import); the scenario
runner and ``recover report`` call :func:`write_report`. The computation is the core's
(:mod:`recovery.report`); this module only renders and writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from recovery.fsutil import atomic_write
from recovery.report import Report, build_report, load_run
from recovery.report.runbook import render_markdown
from service.reportgen.timeline import render_png

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_PNG = "timeline.png"

__all__ = [
    "REPORT_JSON",
    "REPORT_MD",
    "TIMELINE_PNG",
    "build_report",
    "load_run",
    "render_png",
    "write_report",
]


def write_report(directory: Path) -> Report:
    """Read the run in ``directory``, build its report and write ``report.json``,
    ``report.md`` and ``timeline.png`` there (each replaced atomically). Returns the report.

    Raises:
        RunDirError: a file of the run is missing or malformed (the message names it).
        OSError: the directory cannot be written.
    """
    directory = Path(directory)
    report = build_report(load_run(directory))
    atomic_write(directory / TIMELINE_PNG, render_png(report))
    atomic_write(directory / REPORT_MD, render_markdown(report, TIMELINE_PNG).encode())
    doc = json.dumps(report.to_json(), indent=2) + "\n"
    atomic_write(directory / REPORT_JSON, doc.encode())
    return report
