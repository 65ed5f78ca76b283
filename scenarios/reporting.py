"""The one place the runner calls the incident report (``recovery.report.write_report``), and
the little it reads back from it: each incident's phases and lost progress, the run's goodput.

The report reads the run directory the runner wrote (``run.json``, ``incidents.json``,
``events.jsonl``) and writes ``report.json``, ``report.md`` and ``timeline.png`` there. When
``recovery.report`` is not installed the run still passes or fails on everything else, and the
phase budgets say they were not checked.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scenarios.schema import PHASES


@dataclass(frozen=True)
class IncidentCost:
    """One incident as the report measured it. Phases in seconds (None: did not happen)."""

    id: str
    node: str
    fault: str
    phases: dict[str, float | None]
    steps_recomputed: int | None
    restored_step: int | None
    fallbacks: int | None


@dataclass(frozen=True)
class ReportSummary:
    """What the runner and ``recover demo`` show of the report."""

    incidents: tuple[IncidentCost, ...]
    goodput: float | None
    timeline: Path | None
    markdown: Path | None


def write_report(run_dir: Path) -> ReportSummary | None:
    """Have ``recovery.report`` write its report into ``run_dir``; None when that module is
    not installed. Errors of the report itself propagate."""
    try:
        module = importlib.import_module("recovery.report")
    except ModuleNotFoundError as e:
        if e.name in ("recovery.report", "recovery"):
            return None
        raise
    report = module.write_report(run_dir)
    return summarize(report, run_dir)


def summarize(report: Any, run_dir: Path) -> ReportSummary:
    """The parts of a ``recovery.report.Report`` the runner reads (duck-typed: the report is
    another module's, and only these attributes are relied on)."""
    incidents = []
    for inc in getattr(report, "incidents", ()):
        phases = dict(getattr(inc, "phases", {}) or {})
        incidents.append(
            IncidentCost(
                id=str(getattr(inc, "id", "") or getattr(inc, "incident", "")),
                node=str(getattr(inc, "node", "")),
                fault=str(getattr(inc, "fault", "")),
                phases={k: _seconds(phases.get(k)) for k in PHASES},
                steps_recomputed=_int(getattr(inc, "steps_recomputed", None)),
                restored_step=_int(getattr(inc, "restored_step", None)),
                fallbacks=_int(_count(getattr(inc, "fallbacks", None))),
            )
        )
    png = run_dir / "timeline.png"
    md = run_dir / "report.md"
    goodput = getattr(report, "goodput", None)
    return ReportSummary(
        incidents=tuple(incidents),
        goodput=float(goodput) if isinstance(goodput, int | float) else None,
        timeline=png if png.exists() else None,
        markdown=md if md.exists() else None,
    )


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(value: object) -> object:
    """Fallbacks may come as a number or as a list of what was skipped."""
    return len(value) if isinstance(value, list | tuple) else value
