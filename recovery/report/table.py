"""The report as plain text: what ``recover report DIR`` prints. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recovery.report.goodput import Goodput
from recovery.report.model import IncidentReport, Report
from recovery.report.phases import PHASES
from recovery.report.restarts import RESTART_PHASES, Restart
from recovery.report.slowdown import Slowdown

#: Badput buckets as people read them.
BUCKET_NAMES = {
    "productive": "productive (goodput)",
    "program_startup": "program startup",
    "checkpoint_restore": "checkpoint restore",
    "wasted_progress_from_disruption": "wasted progress from disruption",
    "infrastructure_recovery_from_disruption": "infrastructure recovery from disruption",
    "hung_until_stopped": "hung until stopped (a stall)",
    "slowed_by_a_straggler": "slowed by a straggler",
    "checkpoint_save_blocking": "checkpoint save blocking",
    "other": "other",
}


def seconds(value: float | None) -> str:
    """``12.345`` -> ``"12.35 s"``; None -> ``"-"``."""
    return "-" if value is None else f"{value:.2f} s"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns as wide as their widest cell; the columns in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def cell(i: int, c: str) -> str:
        return c.rjust(widths[i]) if i in right else c.ljust(widths[i])

    return "\n".join("  ".join(cell(i, c) for i, c in enumerate(r)).rstrip() for r in cells)


def phase_spans(inc: IncidentReport) -> dict[str, str]:
    """What each phase runs between, in this incident's words."""
    out = f"{inc.node} {inc.taken_out_as or 'out'}"
    restored = (
        f"restored step {inc.restored_step}" if inc.restored_step is not None else "no restore"
    )
    fallbacks = f", {len(inc.fallbacks)} fallback(s)" if inc.fallbacks else ""
    high = inc.high_water_step if inc.high_water_step is not None else 0
    by = "its supervisor" if inc.supervised else "the coordinator"
    return {
        "detection": (
            "fault -> the job's supervisor saw the stall"
            if inc.supervised
            else "fault -> coordinator decision recorded"
        ),
        "diagnose": f"{by} noticed -> every rank's stacks captured",
        "stall": f"fault -> every process of the job stopped ({len(inc.stopped)})"
        + (", ended by its supervisor" if inc.supervised else ""),
        "take_out": f"decision -> {out}",
        "requeue_wait": ("every process stopped" if "stall" in inc.chain else out)
        + " -> Slurm runs the job again",
        "replacement": f"fault -> {inc.spare or 'a spare'} promoted and ready",
        "job_restart": (
            "launch ended -> trainer process started again"
            if inc.supervised
            else "job running again -> trainer process started"
        ),
        "restore": f"started -> {restored}{fallbacks}",
        "warmup": "restored -> first update begins (compile)",
        "recompute": f"redo {inc.steps_recomputed or 0} step(s) up to step {high}",
        "no_progress": f"last update before the restart (step {high}) -> first one past it",
    }


#: The mark (:attr:`IncidentReport.marks`) each phase ends at.
PHASE_ENDS = {
    "detection": "noticed",
    "diagnose": "stacks",
    "stall": "all_stopped",
    "take_out": "node_out",
    "requeue_wait": "job_running",
    "replacement": "spare_ready",
    "job_restart": "started",
    "restore": "restored",
    "warmup": "first_step",
    "recompute": "caught_up",
    "no_progress": "progress",
}


def offset(inc: IncidentReport, mark: str) -> str:
    """When ``mark`` happened, as ``+12.34 s`` from the fault (``-`` if it did not)."""
    at = inc.marks.get(mark)
    return "-" if at is None else f"{at - inc.fault_at:+.2f} s"


def phase_rows(inc: IncidentReport) -> list[tuple[str, str, str, str]]:
    """``(phase, seconds, end from the fault, what it spans or why it did not happen)``."""
    what = phase_spans(inc)
    return [
        (
            name,
            seconds(inc.phases[name]),
            offset(inc, PHASE_ENDS[name]) if inc.phases[name] is not None else "-",
            what[name] if inc.phases[name] is not None else f"n/a: {inc.why.get(name, '')}",
        )
        for name in PHASES
    ]


def headline(inc: IncidentReport) -> str:
    """Lost progress against replacement time, in one line."""
    lost = inc.steps_recomputed
    recompute = inc.phases["recompute"]
    replacement = inc.phases["replacement"]
    lost_text = "-" if lost is None else f"{lost} step(s), {seconds(recompute)} recomputing"
    repl_text = (
        seconds(replacement)
        if replacement is not None
        else f"none ({inc.why.get('replacement', 'no spare')})"
    )
    again = seconds(inc.recovery_s) if inc.recovery_s is not None else "never"
    return (
        f"lost progress: {lost_text}; replacement: {repl_text}; fault -> training again: "
        f"{again}; without progress: {seconds(inc.phases['no_progress'])}"
    )


def goodput_rows(g: Goodput) -> list[tuple[str, str, str]]:
    rows = [(BUCKET_NAMES["productive"], f"{g.productive_s:.2f}", f"{100 * g.goodput:.1f}%")]
    rows += [(BUCKET_NAMES[b.name], f"{b.seconds:.2f}", f"{100 * b.share:.1f}%") for b in g.badput]
    total = g.productive_s + sum(b.seconds for b in g.badput)
    what = "wall time" if g.processes == 1 else f"wall time x {g.processes} processes"
    rows.append(
        (f"total ({what})", f"{total:.2f}", f"{100 * total / g.wall_s:.1f}%" if g.wall_s else "-")
    )
    return rows


def job_title(report: Report) -> str:
    """``job 1 (mlp-small, 30 steps, checkpoint every 5)``, leaving out what is not known."""
    job = report.job
    terms = [
        job.model,
        f"{job.steps} steps" if job.steps is not None else "",
        f"checkpoint every {job.save_every}" if job.save_every is not None else "",
    ]
    what = ", ".join(t for t in terms if t)
    return job.label + (f" ({what})" if what else "")


def job_line(report: Report) -> str:
    """:func:`job_title` and the nodes it ran on, when known."""
    nodes = report.job.nodes
    return job_title(report) + (f" on {','.join(nodes)}" if nodes else "")


def events_line(report: Report) -> str:
    """What the job's events tell over the run, in one line: its runs, restores,
    checkpoints and steps recomputed."""
    restored = [p.restored_step for p in report.processes if p.restored_step is not None]
    fallbacks = sum(len(p.fallbacks) for p in report.processes)
    saved = [c.step for p in report.processes for c in p.checkpoints]
    return (
        f"{len(report.processes)} run(s) of the job, {len(report.restarts)} restart(s); "
        + (f"restored step(s) {', '.join(map(str, restored))}" if restored else "no restore")
        + (f", {fallbacks} damaged checkpoint(s) skipped" if fallbacks else "")
        + f"; {len(saved)} checkpoint(s)"
        + (f", the last at step {saved[-1]}" if saved else "")
        + f"; {report.steps_recomputed} step(s) recomputed"
        + (f"; reached step {report.final_step}" if report.final_step is not None else "")
    )


def restart_spans(r: Restart) -> dict[str, str]:
    """What each of a restart's phases runs between."""
    restored = f"restored step {r.restored_step}" if r.restored_step is not None else "no restore"
    fallbacks = f", {len(r.fallbacks)} fallback(s)" if r.fallbacks else ""
    high = r.high_water_step if r.high_water_step is not None else 0
    return {
        "gap": f"run {r.index - 1} {r.before} (its last event) -> run {r.index} started",
        "restore": f"started -> {restored}{fallbacks}",
        "warmup": "restored -> first update begins (compile)",
        "recompute": f"redo {r.steps_recomputed} step(s) up to step {high}",
        "no_progress": f"last update before the restart (step {high}) -> first one past it",
    }


#: The mark (:attr:`Restart.marks`) each restart phase ends at.
RESTART_ENDS = {
    "gap": "started",
    "restore": "restored",
    "warmup": "first_step",
    "recompute": "caught_up",
    "no_progress": "progress",
}


def restart_rows(r: Restart) -> list[tuple[str, str, str, str]]:
    """``(phase, seconds, end from the run before stopping, what it spans or why not)``."""
    what = restart_spans(r)
    stopped = r.marks["stopped"]

    def ends(name: str) -> str:
        at = r.marks.get(RESTART_ENDS[name])
        return "-" if at is None or r.phases[name] is None else f"{at - stopped:+.2f} s"

    return [
        (
            name,
            seconds(r.phases[name]),
            ends(name),
            what[name] if r.phases[name] is not None else f"n/a: {r.why.get(name, '')}",
        )
        for name in RESTART_PHASES
    ]


def restart_headline(r: Restart) -> str:
    """A restart in one line: where it took up, what it redid."""
    on = f" on {r.node}" if r.node else ""
    took = (
        f"restored step {r.restored_step}"
        if r.restored_step is not None
        else "started from step 0 (no checkpoint)"
    )
    high = r.high_water_step if r.high_water_step is not None else 0
    return (
        f"restart {r.index}{on}, after run {r.index - 1} {r.before}: {took}; step {high} "
        f"had been reached, {r.steps_recomputed} step(s) recomputed"
    )


def slowdown_lines(s: Slowdown) -> list[str]:
    """One slow node's cost, in words: the slowdown, then before, swap and after."""
    factor = f"{s.factor:.2f}x" if s.factor is not None else "?"
    if s.why:
        return [f"slow node {s.node} ({s.incident}): cost not measured: {s.why}"]
    lines = [
        f"slow node {s.node} ({s.incident}): {s.swap}; steps took {seconds(s.slow_step_s)} "
        f"instead of {seconds(s.baseline_step_s)} ({factor}) over {s.steps_slow} update(s)",
        ("  lost while it was in: " if s.swap_s is None else "  lost before the swap: ")
        + seconds(s.lost_before_s)
        + (f"; the swap: {seconds(s.swap_s)}" if s.swap_s is not None else "")
        + (f"; lost after it: {seconds(s.lost_after_s)}" if s.lost_after_s is not None else "")
        + f"; in all {seconds(s.total_s)}",
    ]
    if s.swap_detail:
        lines.append(f"  why: {s.swap_detail}")
    return lines


def render_table(report: Report, png: str | None = None) -> str:
    """The text ``recover report DIR`` prints: per incident each phase and lost progress
    against replacement time, then goodput and badput, then the timeline's path. For a run
    started by hand: what its events tell, each restart's phases, and what cannot be known
    without the scenario runner's files."""
    head = (
        f"run {report.scenario}: {report.directory}"
        if report.scenario
        else f"run started by hand: {report.directory}"
    )
    lines = [
        head,
        f"{job_line(report)}; wall {report.wall_s:.2f} s; "
        + ("completed" if report.completed else "did NOT complete")
        + _digest(report),
    ]
    if report.missing:
        lines.append(events_line(report))
    if not report.journal_known:
        lines.append("incidents: not known (no journal)")
    elif not report.incidents:
        lines.append("no incident")
    for inc in report.incidents:
        at = f" at step {inc.step_at_fault}" if inc.step_at_fault is not None else ""
        lines += [
            "",
            f"incident {inc.id}: {inc.fault} on {inc.node}{at} -> {inc.verdict} ({inc.status})",
            table(("PHASE", "TIME", "ENDS", "SPANS"), phase_rows(inc), right=(1, 2)),
            "fault -> training again = " + " + ".join(inc.chain),
            headline(inc),
            *(f"note: {n}" for n in inc.notes),
        ]
    if not report.journal_known:
        for r in report.restarts:
            lines += [
                "",
                restart_headline(r),
                table(("PHASE", "TIME", "ENDS", "SPANS"), restart_rows(r), right=(1, 2)),
            ]
    for slow in report.slowdowns:
        lines += ["", *slowdown_lines(slow)]
    for f in report.unmatched_faults:
        lines += ["", f"fault {f.fault} injected on {f.node} via {f.via}: NO incident opened"]
    if report.unknown:
        lines += ["", "not known without the scenario runner's files:"]
        lines += [f"- {u}" for u in report.unknown]
    lines += [
        "",
        f"goodput {100 * report.goodput.goodput:.1f}% of {report.goodput.wall_s:.2f} s"
        + (f" ({report.goodput.processes} processes)" if report.goodput.processes > 1 else ""),
        table(("BUCKET", "SECONDS", "SHARE"), goodput_rows(report.goodput), right=(1, 2)),
    ]
    if png:
        lines += ["", f"timeline: {png}"]
    return "\n".join(lines)


def _digest(report: Report) -> str:
    if report.digest_match is None:
        return ""
    return (
        "; final state equals the uninterrupted control run"
        if report.digest_match
        else "; final state DIFFERS from the uninterrupted control run"
    )


def render_modes(runs: Sequence[tuple[str, Report, int]]) -> str:
    """The same fault recovered in several modes, one column each: every phase of the first
    incident, lost progress, replacement, goodput, and the nodes each job held. ``runs``:
    ``(mode, report, nodes the job held)``."""
    incs = [r.incidents[0] if r.incidents else None for _, r, _ in runs]

    def phase(inc: IncidentReport | None, name: str) -> str:
        return "-" if inc is None else seconds(inc.phases.get(name))

    rows: list[list[str]] = [[name, *(phase(i, name) for i in incs)] for name in PHASES]
    rows.append(["fault -> training again",
                 *("-" if i is None else seconds(i.recovery_s) for i in incs)])  # fmt: skip
    rows.append(["steps recomputed", *(
        "-" if i is None or i.steps_recomputed is None else str(i.steps_recomputed)
        for i in incs)])  # fmt: skip
    rows.append(["goodput (process time)",
                 *(f"{100 * r.goodput.goodput:.1f}%" for _, r, _ in runs)])  # fmt: skip
    rows.append(["nodes the job held", *(str(n) for _, _, n in runs)])
    rows.append(["goodput (nodes held)", *(
        f"{100 * r.goodput.goodput * r.goodput.processes / n:.1f}%" if n else "-"
        for _, r, n in runs)])  # fmt: skip
    rows.append(["final state = control", *(
        "-" if r.digest_match is None else ("yes" if r.digest_match else "NO")
        for _, r, _ in runs)])  # fmt: skip
    head = ["", *(mode for mode, _, _ in runs)]
    return table(head, rows, right=tuple(range(1, len(head))))
