"""Checking a scenario's expectations against what the run did. Pure: an outcome in, checks out.

Every check says what was expected and what happened, and when it failed by how much
(``6 steps recomputed, at most 4 allowed (2 over)``). A check that cannot be made (no report
to read phases from, budgets not enforced) is listed with ``ok=None`` and the reason; only a
``False`` fails the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recovery.ports.journal import PhaseName
from recovery.report.processes import split_processes
from recovery.report.restarts import steps_recomputed
from recovery.report.run import RunDirError, event_records
from scenarios.reporting import ReportSummary
from scenarios.schema import Expectations


@dataclass(frozen=True)
class Check:
    """One expectation's result: ``ok`` True (held), False (failed) or None (not checked)."""

    name: str
    ok: bool | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class Progress:
    """Lost progress as the job's own events tell it."""

    steps_recomputed: int
    fallbacks: int
    restored_steps: tuple[int, ...]
    error: str | None = None
    """Why nothing could be counted (the event log is malformed); the counts are then 0 and
    the checks on them fail with this reason."""


def progress(events: Sequence[Mapping[str, Any]]) -> Progress:
    """Steps recomputed, counted as the report counts them
    (:func:`recovery.report.restarts.steps_recomputed`: for each process after the first,
    the furthest step reached before it started minus the step it resumed from, whether or
    not the loop writes the optional ``warmup`` event), checkpoints skipped as damaged, and
    the steps restored. ``events``: the job's event log (process 0's), one record per line.
    A malformed record, which the report would refuse too, gives a :class:`Progress` with
    its ``error``."""
    try:
        parsed = event_records(events, "the job's events.jsonl")
    except RunDirError as e:
        return Progress(0, 0, (), error=str(e))
    return Progress(
        steps_recomputed(split_processes(parsed)),
        sum(1 for e in parsed if e.kind == "fallback"),
        tuple(e.step for e in parsed if e.kind == "restored" and e.step is not None),
    )


@dataclass(frozen=True)
class OperatorAnswer:
    """How an operator action was answered, and how the scenario expected it to be."""

    label: str
    expected: str | None
    got: str
    detail: str


@dataclass(frozen=True)
class Outcome:
    """What the run did, as far as the expectations ask."""

    job_state: str
    final_digest: str | None
    control_digest: str | None
    progress: Progress
    incidents: Sequence[Mapping[str, Any]]
    """The journal's incidents (``GET /v1/incidents/{id}``), oldest first."""
    requeues: int | None = None
    """Times Slurm requeued the job (its restart count at the end); None: unknown."""
    node_states: Mapping[str, str] = field(default_factory=dict)
    """For each node the expectations name, where it is at the end: ``in-service``,
    ``spare`` (back in the pool) or ``out`` (out of service, not in the pool)."""
    operator: Sequence[OperatorAnswer] = ()
    report: ReportSummary | None = None
    report_error: str | None = None
    """Why the report could not be written, if it could not."""
    error: str | None = None
    """Why the run stopped before its end, if it did."""


def check(expect: Expectations, out: Outcome, *, enforce_budgets: bool = True) -> list[Check]:
    """Every expectation of ``expect`` against ``out``, in the order the schema lists them."""
    checks: list[Check] = []

    def add(name: str, ok: bool | None, detail: str) -> None:
        checks.append(Check(name, ok, detail))

    if out.error:
        add("run", False, out.error)
    if out.report_error:
        add("report", False, f"the report could not be written: {out.report_error}")
    if expect.completes:
        add("completes", out.job_state == "COMPLETED", f"the job ended {out.job_state}")
    if expect.digest_matches_control:
        checks.append(_digest(out))
    p = out.progress
    if p.error:
        for name in ("max_steps_recomputed", "min_fallbacks"):
            if getattr(expect, name) is not None:
                add(name, False, f"not counted: {p.error}")
    elif expect.max_steps_recomputed is not None:
        limit, got = expect.max_steps_recomputed, p.steps_recomputed
        over = f" ({got - limit} over)" if got > limit else ""
        add("max_steps_recomputed", got <= limit,
            f"{got} steps recomputed, at most {limit} allowed{over}")  # fmt: skip
    if expect.min_fallbacks is not None and not p.error:
        want, got = expect.min_fallbacks, p.fallbacks
        short = f" ({want - got} short)" if got < want else ""
        add("min_fallbacks", got >= want,
            f"{got} damaged checkpoint(s) skipped, at least {want} expected{short}")  # fmt: skip
    if expect.max_requeues is not None:
        if out.requeues is None:
            add("max_requeues", None, "the job's restart count is unknown")
        else:
            add("max_requeues", out.requeues <= expect.max_requeues,
                f"the job was requeued {out.requeues} time(s), at most "
                f"{expect.max_requeues} allowed")  # fmt: skip
    if expect.incidents is not None:
        got, want = len(out.incidents), expect.incidents
        diff = f" ({got - want:+d})" if got != want else ""
        add("incidents", got == want, f"{got} incident(s) opened, expected {want}{diff}")
    if expect.verdicts is not None:
        got_v = [str(i.get("verdict")) for i in out.incidents]
        want_v = [str(v) for v in expect.verdicts]
        add("verdicts", got_v == want_v,
            f"verdicts {', '.join(got_v) or 'none'}; expected {', '.join(want_v)}")  # fmt: skip
    for key, attr in (("incident_faults", "fault"), ("incident_nodes", "node")):
        wanted = getattr(expect, key)
        if wanted is not None:
            got_f = [str(i.get(attr)) for i in out.incidents]
            add(key, got_f == list(wanted),
                f"incident {attr}s {', '.join(got_f) or 'none'}; expected "
                f"{', '.join(wanted) or 'none'}")  # fmt: skip
    for name in expect.incident_phases or ():
        checks.append(_phase_seen(name, out.incidents))
    if expect.held is not None:
        held = [str(i["id"]) for i in out.incidents if PhaseName.held in _phase_names(i)]
        which = f" ({', '.join(held)})" if held else ""
        detail = f"{len(held)} incident(s) held by the breaker{which}, expected {expect.held}"
        add("held", len(held) == expect.held, detail)
    for key, wanted in (("out_of_service", "out"), ("in_service", "in-service")):
        for node in getattr(expect, key) or ():
            state = out.node_states.get(node, "unknown")
            add(f"{key} {node}", state == wanted, f"{node} is {state} at the end")
    for a in out.operator:
        if a.expected is not None:
            add(f"operator {a.label}", a.got == a.expected,
                f"answered {a.got}, expected {a.expected}: {a.detail}")  # fmt: skip
    checks += _budgets(expect, out.report, enforce=enforce_budgets)
    return checks


def _digest(out: Outcome) -> Check:
    final, control = out.final_digest, out.control_digest
    if final is None:
        return Check("digest_matches_control", False, "no final digest: the job did not complete")
    if control is None:
        return Check("digest_matches_control", False, "the control run gave no digest")
    same = final == control
    rel = "==" if same else "!="
    return Check("digest_matches_control", same, f"final {final[:16]} {rel} control {control[:16]}")


def _phase_names(incident: Mapping[str, Any]) -> list[str]:
    return [str(p["name"]) for p in incident.get("phases", [])]


def _phase_seen(name: str, incidents: Sequence[Mapping[str, Any]]) -> Check:
    """Whether some incident reached journal phase ``name`` (a :class:`PhaseName` value)."""
    having = [str(i["id"]) for i in incidents if name in _phase_names(i)]
    if having:
        return Check(f"incident_phases {name}", True, f"reached by {', '.join(having)}")
    seen = ", ".join(sorted({n for i in incidents for n in _phase_names(i)})) or "none"
    return Check(
        f"incident_phases {name}", False, f"no incident reached {name!r} (phases seen: {seen})"
    )


def _budgets(expect: Expectations, report: ReportSummary | None, *, enforce: bool) -> list[Check]:
    out: list[Check] = []
    for phase, budget in (expect.phases or {}).items():
        name = f"phases.{phase}"
        if report is None:
            out.append(Check(name, None, "not checked: no report (see the notes in run.json)"))
            continue
        measured = [(i.id, i.phases.get(phase)) for i in report.incidents]
        values = [(inc, v) for inc, v in measured if v is not None]
        if not values:
            out.append(Check(name, None, f"no incident has a {phase} phase"))
            continue
        inc, worst = max(values, key=lambda x: x[1])
        over = f" ({worst - budget:.1f} s over)" if worst > budget else ""
        detail = f"{worst:.1f} s ({inc}), budget {budget:g} s{over}"
        if not enforce:
            out.append(Check(name, None, f"{detail}; budgets not enforced"))
        else:
            out.append(Check(name, worst <= budget, detail))
    return out
