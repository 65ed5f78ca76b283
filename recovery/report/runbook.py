"""``report.md``: the report as an operator's runbook entry - what happened, what the toolkit
did, what it cost, what to check next. Pure: a :class:`Report` in, Markdown out."""

from __future__ import annotations

import time
from collections.abc import Sequence

from recovery.ports.journal import PhaseName
from recovery.report.model import IncidentReport, Report
from recovery.report.table import (
    events_line,
    goodput_rows,
    headline,
    job_title,
    offset,
    phase_rows,
    restart_headline,
    restart_rows,
    seconds,
)

#: What a node left out of service needs before it may go back, by fault family.
_REPAIR_HINTS = {
    "xid79": "the GPU fell off the bus: reseat or replace it (reboot at the least) and check "
    "PCIe and power",
    "xid48": "double-bit ECC error: reset the GPU and check its retired/remapped rows",
    "xid95": "uncontained ECC error: reset the GPU; replace it if it repeats",
    "gpu-lost": "the driver lost the GPU: reboot, then check it with nvidia-smi",
    "node-unreachable": "slurmd stopped answering: check the machine, its network and slurmd",
}


def _utc(wall: float) -> str:
    return (
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(wall))
        + f".{int(wall * 1000) % 1000:03d} UTC"
    )


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cells(r: Sequence[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |"

    return [cells(headers), "|" + "|".join("---" for _ in headers) + "|", *map(cells, rows)]


def _happened(report: Report, inc: IncidentReport) -> list[str]:
    of = f" of {report.job.steps}" if report.job.steps is not None else ""
    at = f", at step {inc.step_at_fault}{of}" if inc.step_at_fault else ""
    on = f" on {', '.join(report.job.nodes)}" if report.job.nodes else ""
    lines = [
        f"- **{_utc(inc.fault_at)}**: fault **{inc.fault}** on **{inc.node}** "
        f"({inc.fault_source}){at}, while {report.job.label} ran{on}.",
        f"- The coordinator decided **{inc.verdict}** {offset(inc, 'decided')} from the fault: "
        f"{inc.decision or 'no reason recorded'}.",
    ]
    if inc.supervised:
        lines.append(
            f"- The job's supervisor saw the stall {offset(inc, 'noticed')} from the fault, had "
            f"every rank's stacks {offset(inc, 'stacks')}, ended the launch "
            f"{offset(inc, 'all_stopped')} and relaunched it inside the allocation."
        )
    inside = _in_allocation(inc)
    if inside:
        lines.append(
            f"- Path for the job: inside its allocation (its supervisor relaunched it on nodes "
            f"of its own allocation: job {inside}); the coordinator's path was "
            f"{inc.path or 'none'}."
        )
    elif inc.path:
        lines.append(f"- Path for the job: {inc.path}.")
    if "stacks" in inc.marks:
        lines.append(
            f"- The stacks of the job's processes were taken {offset(inc, 'stacks')} from the "
            "fault, before anything stopped them: `progress/stacks/rank<r>.txt` in the job's "
            "run directory."
        )
    lines += _ended_jobs(inc)
    if inc.interrupted:
        lines.append(f"- After the fault {inc.interrupted}.")
    if inc.restored_step is not None:
        lines.append(
            f"- The job started again (process {offset(inc, 'started')} from the fault) and "
            f"restored step {inc.restored_step}; it had reached step {inc.high_water_step}, so "
            f"{inc.steps_recomputed} step(s) were done again."
        )
    for f in inc.fallbacks:
        lines.append(
            f"- Checkpoint step {f.step} failed verification and was set aside as "
            f"`{f.moved_to}`: {f.reason}."
        )
    return lines


def _ended_jobs(inc: IncidentReport) -> list[str]:
    """The jobs the fault ended before Slurm could requeue them, and what became of them."""
    said = {m.name: m.detail for m in inc.journal}
    lines = []
    if PhaseName.job_ended in said:
        lines.append(
            f"- A job ended before Slurm could requeue it: {said[PhaseName.job_ended]} "
            "(its process died with the node's fault)."
        )
        requeued = said.get(PhaseName.jobs_requeued, "")
        if "requeued by the coordinator" in requeued or "requeued already" in requeued:
            lines.append(f"- The coordinator requeued it: {requeued}.")
    if PhaseName.requeue_refused in said:
        lines.append(f"- Not requeued: {said[PhaseName.requeue_refused]}.")
    return lines


def _did(inc: IncidentReport) -> list[str]:
    rows = [
        (
            offset(inc, "fault") if a.at is None else f"{a.at - inc.fault_at:+.2f} s",
            a.kind,
            a.node,
            a.status,
            f'Slurm reason "{a.slurm_reason}"' if a.slurm_reason else a.detail,
        )
        for a in inc.actions
    ]
    lines = [
        "Actions (from the journal):",
        "",
        *_md_table(("at", "action", "node", "status", "detail"), rows),
    ]
    lines += ["", "Journal phases:", ""]
    lines += _md_table(
        ("at", "phase", "detail"),
        [(f"{p.at - inc.fault_at:+.2f} s", p.name, p.detail or "") for p in inc.journal],
    )
    if inc.supervisor:
        lines += ["", "The job's supervisor (its journal, `supervisor-<job>.jsonl`):", ""]
        lines += _md_table(
            ("at", "event", "detail"),
            [
                (f"{at - inc.fault_at:+.2f} s", event, detail)
                for at, event, detail in inc.supervisor
            ],
        )
    return lines


def _cost(inc: IncidentReport) -> list[str]:
    notes = [f"- {n[0].upper()}{n[1:]}." for n in inc.notes]
    return [
        *_md_table(("phase", "time", "ends (from fault)", "spans"), phase_rows(inc)),
        "",
        headline(inc),
        *(["", *notes] if notes else []),
    ]


def _next_steps(report: Report, inc: IncidentReport) -> list[str]:
    hint = _REPAIR_HINTS.get(inc.fault, f"find the cause of {inc.fault}")
    steps: list[str] = []
    if inc.returned_to_pool:
        steps.append(f"`{inc.node}` was {inc.node_left}; nothing to do for it.")
    elif inc.taken_out_as:
        steps.append(
            f"`{inc.node}` is left **{inc.taken_out_as}** with reason "
            f'"{inc.slurm_reason}": {hint}. Then `recover node repaired {inc.node}` returns it '
            "to the spare pool (refused while it flaps)."
        )
    else:
        steps.append(f"`{inc.node}` stayed in service; watch it for a repeat of {inc.fault}.")
    rejected = sorted({c["spare"] for c in inc.spare_checks if c["verdict"].startswith("failed")})
    if inc.spare and inc.spare != inc.node:
        used = sum(1 for i in report.incidents if i.spare)
        held = {
            c["spare"]
            for i in report.incidents
            for c in i.spare_checks
            if c["verdict"].startswith("failed")
        }
        left = max(0, len(report.spares) - used - len(held - {i.spare for i in report.incidents}))
        runs = (
            "is in service (a refill: the job recovered on a spare of its own)"
            if _in_allocation(inc)
            else "now runs the job"
        )
        steps.append(
            f"Spare `{inc.spare}` {runs}; {left} spare(s) left in the pool"
            + (" - the next fault will wait for a repair." if left == 0 else ".")
        )
    for spare in rejected:
        steps.append(
            f"Spare `{spare}` failed its check and is held out (`recover status` shows why); "
            f"fix it, then `recover node check {spare}` returns it to the pool."
        )
    if "replacement" in inc.why:
        steps.append(f"No spare was promoted: {inc.why['replacement']}.")
    if any("spare pool was empty" in n for n in inc.notes):
        steps.append(
            "The job waited for a spare: keep at least one in the pool (`recover cluster "
            "retire NODE` takes an idle node into it)."
        )
    if inc.fallbacks:
        steps.append(
            f"Checkpoints were damaged: `recover checkpoint verify {report.job.run_dir}` and "
            "check the storage they were written to."
        )
    return [f"- {s}" for s in steps]


def render_markdown(report: Report, png_name: str | None = "timeline.png") -> str:
    """The runbook entry for ``report``; ``png_name`` is embedded as the timeline image."""
    g = report.goodput
    out = [
        f"# Incident report: {report.scenario}"
        if report.scenario
        else "# Run report: a run started by hand",
        "",
        f"Run `{report.directory}`: {job_title(report)} from "
        f"{_utc(report.started)} for {report.wall_s:.2f} s; "
        + ("it completed." if report.completed else "it did **not** complete."),
    ]
    if report.missing:
        out.append(f"From the job's events: {events_line(report)}.")
    if report.digest_match is not None:
        out.append(
            "The final state is bit-for-bit equal to an uninterrupted control run."
            if report.digest_match
            else f"**The final state differs from the control run** ({report.final_digest} "
            f"vs {report.control_digest})."
        )
    if png_name:
        out += ["", f"![timeline]({png_name})"]
    if not report.journal_known:
        out += ["", "Incidents are not known: there is no journal (incidents.json)."]
    elif not report.incidents:
        out += ["", "No incident was opened during this run."]
    for f in report.unmatched_faults:
        out += [
            "",
            f"**Fault {f.fault} injected on {f.node} via {f.via} at {_utc(f.at)} opened no "
            "incident**: check that the node's agent runs and reports (`recover status` marks a "
            "silent one as suspect) and that the kernel log line parses (`recover agent parse "
            "FILE`).",
        ]
    for inc in report.incidents:
        out += ["", f"## Incident {inc.id}: {inc.fault} on {inc.node}", ""]
        out += ["### What happened", "", *_happened(report, inc), ""]
        out += ["### What the toolkit did", "", *_did(inc), ""]
        out += ["### What it cost", "", *_cost(inc), ""]
        out += ["### What to check next", "", *_next_steps(report, inc)]
    if report.slowdowns:
        out += ["", "## Slow nodes", "", *_slow(report)]
    if not report.journal_known and report.restarts:
        out += ["", "## Restarts (from the job's events)"]
        for r in report.restarts:
            out += ["", f"{restart_headline(r)}.", ""]
            out += _md_table(("phase", "time", "ends (from the run before stopping)", "spans"),
                             restart_rows(r))  # fmt: skip
    if report.unknown:
        out += ["", "## What this report cannot tell", ""]
        out += [f"- {u[0].upper()}{u[1:]}." for u in report.unknown]
    out += ["", "## Goodput over the run", ""]
    out += [
        f"Goodput {100 * g.goodput:.1f}%: {g.productive_s:.2f} s of {g.wall_s:.2f} s went to "
        "updates that survive into the final state (buckets of Google's goodput accounting).",
        "",
        *_md_table(("bucket", "seconds", "share"), goodput_rows(g)),
    ]
    if report.notes:
        out += ["", "## Notes", "", *(f"- {n}" for n in report.notes)]
    return "\n".join(out) + "\n"


SLOW_HEADERS = (
    "node",
    "done",
    "healthy step",
    "slow step",
    "slowdown",
    "slow updates",
    "lost before swap",
    "swap",
    "lost after",
    "in all",
)


def _slow(report: Report) -> list[str]:
    """What each slow node cost: before the swap, the swap, after it."""
    rows = [
        (
            s.node,
            s.swap,
            seconds(s.baseline_step_s),
            seconds(s.slow_step_s),
            f"{s.factor:.2f}x" if s.factor is not None else "-",
            s.steps_slow,
            seconds(s.lost_before_s),
            seconds(s.swap_s),
            seconds(s.lost_after_s),
            seconds(s.total_s),
        )
        for s in report.slowdowns
    ]
    out = [
        "Time lost to each slow node: every update beyond the healthy step time while the node "
        "was in, the swap (last slow update to the first update past it, less one healthy "
        "step), and the updates after it beyond the healthy step time.",
        "",
        *_md_table(SLOW_HEADERS, rows),
    ]
    for s in report.slowdowns:
        if s.why:
            out += ["", f"- {s.node}: cost not measured: {s.why}."]
        elif s.swap_detail:
            out += ["", f"- {s.node}: {s.swap_detail}."]
    return out


def _in_allocation(inc: IncidentReport) -> str:
    """The ``job@nodes`` of the incident's in-allocation phase (the job recovered on a spare
    of its own), or ``""``."""
    return next((m.detail or "?" for m in inc.journal if m.name == PhaseName.in_allocation), "")
