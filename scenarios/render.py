"""Text for people: a run's result and the list of shipped scenarios."""

from __future__ import annotations

from collections.abc import Sequence

from scenarios.loader import Loaded
from scenarios.runner import RunResult

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
