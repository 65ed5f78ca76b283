"""Text for people: a run's result, the list of shipped scenarios, and the demo's cost table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scenarios.loader import Loaded
from scenarios.reporting import ReportSummary
from scenarios.runner import RunResult
from scenarios.schema import PHASES

_MARK = {True: "ok  ", False: "FAIL", None: "--  "}


def result_text(result: RunResult) -> str:
    """One line per expectation, then where the run directory and the report are."""
    verdict = "PASSED" if result.passed else "FAILED"
    lines = [f"scenario {result.scenario}: {verdict} in {result.elapsed_s:.0f} s"]
    lines += [f"  {_MARK[c.ok]} {c.name}: {c.detail}" for c in result.checks]
    lines.append(f"run directory: {result.out}")
    r = result.report
    if r is not None and r.markdown is not None:
        lines.append(f"report: {r.markdown}")
    if r is not None and r.timeline is not None:
        lines.append(f"timeline: {r.timeline}")
    return "\n".join(lines)


def failure_text(result: RunResult) -> str:
    """The one line the CLI prints to stderr for a failed run: which expectations, how much."""
    what = "; ".join(f"{c.name} ({c.detail})" for c in result.failed)
    return f"scenario {result.scenario} failed: {what}"


def list_text(scenarios: Sequence[Loaded]) -> str:
    """``NAME  DESCRIPTION`` per shipped scenario."""
    width = max((len(x.scenario.name) for x in scenarios), default=4)
    lines = [f"{'NAME':<{width}}  DESCRIPTION"]
    lines += [f"{x.scenario.name:<{width}}  {x.scenario.description}" for x in scenarios]
    return "\n".join(lines)


def cost_table(report: ReportSummary) -> str:
    """Per incident: every phase in seconds, then lost progress beside replacement time."""
    out = []
    for inc in report.incidents:
        out.append(f"incident {inc.id} on {inc.node} ({inc.fault})")
        out.append(f"  {'phase':<14}{'seconds':>9}")
        for name in PHASES:
            value = inc.phases.get(name)
            shown = "-" if value is None else f"{value:.1f}"
            out.append(f"  {name:<14}{shown:>9}")
        lost = "?" if inc.steps_recomputed is None else str(inc.steps_recomputed)
        recompute = inc.phases.get("recompute")
        replacement = inc.phases.get("replacement")
        out.append(
            f"  lost progress: {lost} step(s) recomputed"
            + (f" ({recompute:.1f} s)" if recompute is not None else "")
            + (f", restored step {inc.restored_step}" if inc.restored_step is not None else "")
            + (f"; replacement: {replacement:.1f} s" if replacement is not None else "")
        )
    if report.goodput is not None:
        out.append(f"goodput: {report.goodput:.1%} of the run's wall time was productive training")
    return "\n".join(out)


def journal_timeline(incidents: Sequence[Mapping[str, Any]], fault_at: float | None) -> str:
    """Each incident's journal phases as seconds after the fault (what ``recover demo``
    shows when the report module is not installed)."""
    out = []
    for inc in incidents:
        out.append(f"incident {inc['id']} on {inc['node']} ({inc['fault']} -> {inc['verdict']})")
        phases = sorted(inc.get("phases", []), key=lambda p: p["at"]["wall"])
        base = fault_at if fault_at is not None else (phases[0]["at"]["wall"] if phases else 0.0)
        for p in phases:
            out.append(f"  +{p['at']['wall'] - base:7.1f} s  {p['name']}")
    return "\n".join(out)
