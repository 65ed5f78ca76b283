"""``build_report``: a run record in, the report as values out. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recovery.contract.jobmark import PROGRESS_FAULTS
from recovery.errors import UsageError
from recovery.model import Drain, TakeDown
from recovery.ports.journal import PhaseName
from recovery.ports.slurm import mark
from recovery.report.goodput import SlowWindow, goodput_ranks
from recovery.report.model import ActionLine, IncidentReport, Report
from recovery.report.phases import incident_phases, match_fault
from recovery.report.processes import Process, split_processes
from recovery.report.restarts import restarts, steps_recomputed
from recovery.report.run import (
    INCIDENTS_FILE,
    RUN_FILE,
    ActionEntry,
    Incident,
    RunRecord,
    SupervisorEntry,
)
from recovery.report.slowdown import Slowdown, slowdowns


def _slurm_reason(a: ActionEntry) -> str | None:
    reason = a.params.get("reason")
    if (
        a.kind not in (TakeDown.kind, Drain.kind)
        or not isinstance(reason, str)
        or not reason.strip()
    ):
        return None
    try:
        return mark(reason)
    except UsageError:  # a reason Slurm could not store as it is: show it unmarked
        return reason


def _step_at(processes: Sequence[Process], at: float) -> int | None:
    done = [s.step for p in processes for s in p.steps if s.ts <= at]
    return done[-1] if done else None


def _interrupted(
    processes: Sequence[Process], successor: int | None, fault_at: float, ended: float | None
) -> str:
    """How the process running at the fault ended; ``ended``: when its supervisor saw the
    launch end (a hung process writes nothing after its last update, yet runs until then)."""
    if successor is None or successor == 0:
        return ""
    p = processes[successor - 1]
    last = p.last_step.step if p.last_step else None
    when = f"{max(p.end, ended or p.end) - fault_at:+.2f} s from the fault"
    if p.outcome == "preempted":
        return (
            f"the job ran on to step {last} and, when stopped ({when}), saved step "
            f"{p.final_step} on its way out"
        )
    if p.outcome == "completed":
        return f"the job completed at step {p.final_step} ({when}) before it was restarted"
    return f"the job ran on to step {last} and was killed ({when}) without a final save"


def _recovery(fault_at: float, marks: dict[str, float]) -> float | None:
    first = marks.get("first_step")
    return None if first is None else max(0.0, first - fault_at)


def _node_left(incident: Incident, everything: Sequence[Incident]) -> tuple[str, float | None]:
    """How the failed node was left, and when it went back to the spare pool (None: it did
    not). A repair (``returned-to-pool``) may be journaled under any incident."""
    node = incident.node
    later = sorted(
        (p for inc in everything for p in inc.phases if p.at >= incident.opened),
        key=lambda p: p.at,
    )
    state, returned = None, None
    for p in later:
        if (
            p.name == PhaseName.returned_to_pool
            and p.detail.split()[:1] == [node]
            and returned is None
        ):
            state, returned = "repaired and returned to the spare pool", p.at
        elif p.name == PhaseName.spare_promoted and p.detail == node and returned is not None:
            state = "repaired, returned to the spare pool, then promoted back into service"
    if state:
        return state, returned
    return _taken_out_as(incident) or "in service", None


def _notes(incident: Incident, fault_at: float) -> tuple[str, ...]:
    """What the phase table alone does not say."""
    notes = []
    empty = incident.first(PhaseName.no_spare)
    promoted = incident.first(PhaseName.spare_promoted)
    if empty is not None:
        later = (
            f"; {promoted.detail} was promoted once it was back in the pool "
            f"({promoted.at - fault_at:+.2f} s)"
            if promoted is not None
            else "; no spare came back before the run ended"
        )
        notes.append(f"the spare pool was empty ({empty.at - fault_at:+.2f} s){later}")
    held = incident.first(PhaseName.held)
    if held is not None:
        notes.append(f"the breaker held the actions ({held.at - fault_at:+.2f} s): {held.detail}")
    return tuple(notes)


def _taken_out_as(incident: Incident) -> str | None:
    taken = [
        a for a in incident.actions if a.kind in (TakeDown.kind, Drain.kind) and a.status == "done"
    ]
    if not taken:
        return None
    return "DOWN" if taken[0].kind == TakeDown.kind else "DRAIN"


def _said(e: SupervisorEntry) -> str:
    """One supervisor journal entry in words."""
    d = e.data
    if e.event == "stalled":
        return f"{d.get('why', '')} at step {d.get('step')} ({d.get('idle_s')} s idle)"
    if e.event == "stacks":
        missing = d.get("missing") or []
        return f"every rank's stacks in {d.get('folder')}" + (
            f"; none from rank(s) {', '.join(map(str, missing))}" if missing else ""
        )
    if e.event == "step-ended":
        return f"the launch ended with status {d.get('status')}"
    if e.event in ("relaunch", "slow"):
        return str(d.get("why", ""))
    if e.event == "launched":
        return f"attempt {d.get('attempt')} on {', '.join(d.get('nodes') or [])}"
    return ""


def _supervisor_lines(
    run: RunRecord, ph_marks: dict[str, float]
) -> tuple[tuple[float, str, str], ...]:
    """The supervisor's entries from it noticing the stall to the relaunch."""
    begin = ph_marks["noticed"]
    relaunched = run.supervised("launched", begin)
    end = relaunched.at if relaunched else float("inf")
    return tuple((e.at, e.event, _said(e)) for e in run.supervisor if begin <= e.at <= end)


def _incident(
    inc: Incident, run: RunRecord, processes: Sequence[Process], ranks: Sequence[Sequence[Process]]
) -> IncidentReport:
    ph = incident_phases(inc, run, processes, ranks)
    lines = [
        ActionLine(
            kind=a.kind,
            node=a.node,
            status=a.status,
            detail=a.detail,
            slurm_reason=_slurm_reason(a),
            at=a.finished if a.finished is not None else a.planned,
        )
        for a in inc.actions
    ]
    actions = tuple(sorted(lines, key=lambda a: float("inf") if a.at is None else a.at))
    left, returned = _node_left(inc, run.incidents)
    marks = dict(ph.marks)
    if returned is not None:
        marks["returned"] = returned
    decided = inc.first(PhaseName.decided)
    reasons = [a.slurm_reason for a in actions if a.slurm_reason and a.node == inc.node]
    recovery_s = _recovery(ph.fault_at, ph.marks)
    checks = tuple(dict(c) for c in inc.info.get("spare_checks", []))
    asked, promoted = inc.first(PhaseName.spare_checking), inc.first(PhaseName.spare_promoted)
    check_wait = promoted.at - asked.at if asked is not None and promoted is not None else None
    notes = _notes(inc, ph.fault_at)
    if asked is not None or checks:
        notes += (_checks_note(checks, check_wait, recovery_s),)
    job_wait = None
    if ph.fault_at is not None:
        job_checks, job_wait = _job_spare_checks(run, ph.fault_at)
        if job_checks:
            notes += (_checks_note(job_checks, job_wait, recovery_s, job=True),)
            checks += job_checks
    return IncidentReport(
        id=inc.id,
        node=inc.node,
        fault=inc.fault,
        verdict=inc.verdict,
        status=inc.status,
        fault_at=ph.fault_at,
        fault_source=ph.fault_source,
        step_at_fault=_step_at(processes, ph.fault_at),
        interrupted=_interrupted(
            processes,
            ph.successor,
            ph.fault_at,
            ph.marks.get("all_stopped") if ph.supervised else None,
        ),
        recovery_s=recovery_s,
        phases=ph.phases,
        why=ph.why,
        marks=marks,
        steps_recomputed=ph.steps_recomputed,
        restored_step=ph.restored_step,
        high_water_step=ph.high_water_step,
        fallbacks=ph.fallbacks,
        spare=ph.spare,
        decision=decided.detail if decided else "",
        path=str(inc.info.get("path", "")),
        actions=actions,
        journal=inc.phases,
        node_left=left,
        taken_out_as=_taken_out_as(inc),
        slurm_reason=reasons[0] if reasons else None,
        returned_to_pool=returned is not None,
        successor_index=ph.successor,
        notes=notes,
        chain=ph.chain,
        stopped=ph.stopped,
        supervised=ph.supervised,
        supervisor=_supervisor_lines(run, ph.marks) if ph.supervised else (),
        check_wait_s=check_wait,
        spare_checks=checks,
        relaunch_check_wait_s=job_wait,
    )


def _job_spare_checks(
    run: RunRecord, fault_at: float
) -> tuple[tuple[dict[str, Any], ...], float | None]:
    """The checks the job's in-allocation supervisor made of its spares on the way from the
    fault to its relaunch (``spare-checked`` rows, as the incident's ``spare_checks``), and
    how long the relaunch waited for them."""
    relaunch = run.supervised("relaunch", fault_at)
    if relaunch is None:
        return (), None
    rows = [
        e for e in run.supervisor
        if e.event == "spare-checked" and fault_at <= e.at <= relaunch.at
        and not e.data.get("background")
    ]  # fmt: skip
    checks: list[dict[str, Any]] = []
    for e in rows:
        failed = [c for c in e.data.get("checks", []) if c.get("ok") is False]
        checks.append({
            "spare": str(e.data.get("node", "?")),
            "verdict": str(e.data.get("verdict", "?")),
            "took_s": float(e.data.get("took_s", 0.0)),
            "at": e.at,
            "detail": str(failed[0].get("detail", "")) if failed else "",
        })  # fmt: skip
    if not checks:
        return (), None
    asked = run.supervised("spare-checking", fault_at, relaunch.at)
    start = asked.at if asked is not None else rows[0].at - float(checks[0]["took_s"])
    return tuple(checks), max(0.0, relaunch.at - start)


def _checks_note(
    checks: Sequence[dict[str, Any]],
    waited: float | None,
    recovery_s: float | None,
    *,
    job: bool = False,
) -> str:
    """The spares' checks a promotion (or, ``job``, the job's own relaunch on a spare it
    holds) waited on, what they cost, and what taking a bad one would have cost instead."""
    said = [
        f"{c['spare']} {c['verdict']} in {float(c['took_s']):.1f} s"
        + (f" ({c['detail']})" if c.get("detail") else "")
        for c in checks
    ]
    if job:
        text = "the job's supervisor checked its spares before the relaunch took one: "
    else:
        text = "the spares were checked before one took the job: "
    text += "; ".join(said) or "none"
    if waited is not None:
        text += f"; the {'relaunch' if job else 'promotion'} waited {waited:.1f} s for the checks"
    bad = [c["spare"] for c in checks if c["verdict"] not in ("passed", "forced")]
    if bad and recovery_s is not None:
        text += (
            f". {'Relaunching on' if job else 'Promoting'} {bad[0]} unchecked would have cost "
            f"another recovery like this one (about {recovery_s:.1f} s from fault to training "
            "again"
            + ("" if job else ", and the steps since the last checkpoint again")
            + ") as soon as its fault showed, or later: a node whose agent is dead reports "
            "nothing"
        )
    return text


#: Faults a scenario makes that open no incident by design: a node's agent killed (the node
#: runs on; only its checks and the coordinator's silence rule, ignored by default, see it).
SILENT_FAULTS = frozenset({"agent-kill"})


def _unknown(run: RunRecord) -> tuple[str, ...]:
    """What the report cannot tell without the scenario runner's files, one sentence each."""
    out = []
    if RUN_FILE in run.missing:
        out.append(
            f"no {RUN_FILE} (the scenario runner's record): which faults were injected and "
            "when, the cluster's nodes and spares, and an uninterrupted control run's digest "
            "are not known; the run is taken from the job's first event to its last"
        )
    if INCIDENTS_FILE in run.missing:
        out.append(
            f"no {INCIDENTS_FILE} (the coordinator's journal): no incident is known, so what "
            "stopped the job, detection, take-out, requeue wait and replacement cannot be "
            "told; each restart is measured from the job's events alone, the time between "
            "two runs of it as one gap"
        )
    return tuple(out)


def _hung_windows(incidents: Sequence[IncidentReport]) -> list[tuple[float, float]]:
    """Fault to every process stopped, for each stall (hung or frozen rank)."""
    return [
        (inc.fault_at, inc.marks["all_stopped"])
        for inc in incidents
        if inc.fault in PROGRESS_FAULTS and "all_stopped" in inc.marks
    ]


def _slow_windows(slow: Sequence[Slowdown], finished: float) -> list[SlowWindow]:
    return [
        SlowWindow(s.began, s.stopped if s.stopped is not None else finished, s.baseline_step_s)
        for s in slow
        if s.baseline_step_s is not None
    ]


def build_report(run: RunRecord) -> Report:
    """The report of ``run``: per incident its phases (see :mod:`recovery.report.phases`),
    per restart what the events alone tell (see :mod:`recovery.report.restarts`), over the
    run goodput and badput (see :mod:`recovery.report.goodput`). Never raises on a
    well-formed record; what the record lacks shows as None with the reason, and what a run
    without the runner's files cannot tell is in :attr:`Report.unknown`."""
    processes = split_processes(run.events)
    ranks = tuple(tuple(split_processes(e)) for e in run.ranks)
    incidents = tuple(
        _incident(inc, run, processes, ranks)
        for inc in sorted(run.incidents, key=lambda i: i.opened)
    )
    slow = slowdowns(run, processes)
    matched = {id(f) for inc in run.incidents if (f := match_fault(inc, run.faults))}
    last = processes[-1] if processes else None
    completed = last is not None and last.outcome == "completed"
    digest_match = (
        None
        if run.control_digest is None or run.final_digest is None
        else run.control_digest == run.final_digest
    )
    return Report(
        directory=str(run.directory),
        scenario=run.scenario,
        started=run.started,
        finished=run.finished,
        job=run.job,
        nodes=run.nodes,
        spares=run.spares,
        incidents=incidents,
        unmatched_faults=tuple(
            f for f in run.faults if id(f) not in matched and f.fault not in SILENT_FAULTS
        ),
        goodput=goodput_ranks(
            ranks,
            run.started,
            run.finished,
            hung=_hung_windows(incidents),
            slow=_slow_windows(slow, run.finished),
        ),
        processes=tuple(processes),
        completed=completed,
        final_step=last.final_step if last else None,
        control_digest=run.control_digest,
        final_digest=run.final_digest,
        digest_match=digest_match,
        notes=run.notes,
        ranks=ranks,
        restarts=restarts(processes),
        steps_recomputed=steps_recomputed(processes),
        missing=run.missing,
        unknown=_unknown(run),
        slowdowns=slow,
    )
