"""The one place the runner calls the incident report (:func:`service.reportgen.write_report`),
and the little it keeps of it: each incident's phases and lost progress, the run's goodput,
the table ``recover report`` prints, and where the files are.

The report reads the run directory the runner wrote (``run.json``, ``incidents.json``,
``events.jsonl``) and writes ``report.json``, ``report.md`` and ``timeline.png`` there.
matplotlib is imported only when a report is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recovery.report.phases import PHASES

if TYPE_CHECKING:
    from recovery.report import Report


@dataclass(frozen=True)
class IncidentCost:
    """One incident as the report measured it. Phases in seconds (None: did not happen)."""

    id: str
    node: str
    fault: str
    phases: dict[str, float | None]
    steps_recomputed: int | None
    restored_step: int | None
    fallbacks: int


@dataclass(frozen=True)
class ReportSummary:
    """What the runner and ``recover demo`` show of the report."""

    incidents: tuple[IncidentCost, ...]
    goodput: float | None
    table: str
    """What ``recover report DIR`` prints: phases per incident, goodput and badput."""
    timeline: Path | None
    markdown: Path | None


def write_report(run_dir: Path) -> ReportSummary:
    """Have the report written into ``run_dir`` and summarize it.

    Raises RunDirError when the run directory is malformed (a bug of the runner), OSError
    when it cannot be written.
    """
    from recovery.report.table import render_table
    from service.reportgen import REPORT_MD, TIMELINE_PNG
    from service.reportgen import write_report as write

    report = write(run_dir)
    png, md = run_dir / TIMELINE_PNG, run_dir / REPORT_MD
    return summarize(report, render_table(report, str(png)), png, md)


def summarize(report: Report, table: str, png: Path, md: Path) -> ReportSummary:
    """The parts of ``report`` the runner checks and shows."""
    incidents = tuple(
        IncidentCost(
            id=inc.id,
            node=inc.node,
            fault=inc.fault,
            phases={k: inc.phases.get(k) for k in PHASES},
            steps_recomputed=inc.steps_recomputed,
            restored_step=inc.restored_step,
            fallbacks=len(inc.fallbacks),
        )
        for inc in report.incidents
    )
    return ReportSummary(
        incidents=incidents,
        goodput=report.goodput.goodput,
        table=table,
        timeline=png if png.exists() else None,
        markdown=md if md.exists() else None,
    )
