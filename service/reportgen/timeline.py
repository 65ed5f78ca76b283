"""``timeline.png``: an incident's phases on one time axis, per node, above the training step
line. Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state).

Top panel, one lane per node: the failed node (detection, take-out, then out of service), the
spare (held, the replacement, then in service), for a job of several processes one lane per
rank (training, then the stall: fault to that process stopped) and the job (training,
requeue wait, restart, restore, warmup, recompute). A zoom beside it shows the first moments
after the fault, where the coordinator's phases last fractions of a second. Bottom panel: step
against time, one line per process, with the fault, the checkpoints, the restore and any
fallback marked.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from recovery.report import IncidentReport, Report
from recovery.report.table import seconds

#: One colour per phase, the same in every timeline.
COLOURS = {
    "startup": "#cfd8dc",
    "training": "#9e9e9e",
    "detection": "#d62728",
    "diagnose": "#7f7f7f",
    "stall": "#e377c2",
    "take_out": "#ff7f0e",
    "out_of_service": "#e0e0e0",
    "spare_held": "#f3e5f5",
    "replacement": "#9467bd",
    "in_service": "#c5e1a5",
    "requeue_wait": "#1f77b4",
    "job_restart": "#17becf",
    "restore": "#2ca02c",
    "warmup": "#bcbd22",
    "recompute": "#8c564b",
    "slow": "#ffbb78",
}
_LABELS = {
    "startup": "program startup",
    "training": "training",
    "out_of_service": "node out of service",
    "spare_held": "spare held in the pool",
    "in_service": "spare in service",
    "diagnose": "stacks taken",
    "slow": "a slow node in the job",
}


@dataclass(frozen=True)
class _Bar:
    lane: str
    begin: float
    end: float
    kind: str
    """A key of :data:`COLOURS`."""
    text: str = ""
    short: str = ""
    """Shown instead of ``text`` when that is wider than the bar."""


def _spare_lane(inc: IncidentReport) -> str:
    return f"{inc.spare} (back as the spare)" if inc.spare == inc.node else f"{inc.spare} (spare)"


def _phase_bars(inc: IncidentReport, job: str, end: float) -> list[_Bar]:
    """The bars of one incident, in wall seconds."""
    m = inc.marks
    failed = inc.node if inc.ran_on else f"{inc.node} (failed)"
    bars: list[_Bar] = []

    def add(lane: str, a: str, b: str, kind: str, text: str | None = None) -> None:
        if a in m and b in m and m[b] >= m[a]:
            label = text if text is not None else f"{kind.replace('_', ' ')} {seconds(m[b] - m[a])}"
            bars.append(_Bar(lane, m[a], m[b], kind, label, seconds(m[b] - m[a])))

    add(failed, "fault", "noticed", "detection")
    add(
        failed,
        "noticed",
        "stacks",
        "diagnose",
        f"stacks {seconds(m['stacks'] - m['noticed'])}"
        if "stacks" in m and "noticed" in m
        else None,
    )
    add(failed, "decided", "node_out", "take_out")
    if "node_out" in m:
        why = f"{inc.taken_out_as}: {inc.slurm_reason}" if inc.slurm_reason else "out"
        until = m.get("returned", end)
        bars.append(
            _Bar(failed, m["node_out"], until, "out_of_service", why, inc.taken_out_as or "")
        )
        if "returned" in m:
            bars.append(
                _Bar(
                    failed,
                    until,
                    m.get("spare_ready", end),
                    "spare_held",
                    "repaired: in the pool",
                    "pool",
                )
            )
    if inc.spare and "spare_ready" in m:
        lane = _spare_lane(inc)
        add(lane, "fault", "spare_ready", "replacement")
        bars.append(_Bar(lane, m["spare_ready"], end, "in_service", "in service"))
    take = "node_out" if "node_out" in m else "decided"
    if inc.ran_on:
        return bars
    if "started" not in m and inc.successor_index is None and "requeue_wait" in inc.why:
        why = inc.why.get("replacement", inc.why["requeue_wait"])
        pending = _Bar(job, m[take], end, "requeue_wait", f"job waits to run again: {why}", "waits")
        return [*bars, pending]
    add(job, take, "job_running", "requeue_wait")
    add(job, "job_running" if "job_running" in m else take, "started", "job_restart")
    add(job, "started", "restored", "restore")
    add(job, "restored" if "restored" in m else "started", "first_step", "warmup")
    if (inc.steps_recomputed or 0) > 0:
        add(job, "first_step", "caught_up", "recompute")
    return bars


def _bars(report: Report) -> list[_Bar]:
    job = report.job.label
    bars: list[_Bar] = []
    restarted = {p.index for p in report.processes[1:]} & {
        i.successor_index for i in report.incidents if i.successor_index is not None
    }
    for p in report.processes:
        if not p.steps:
            continue
        if p.index not in restarted:
            # Up to its first update a process is starting (the first one from the run's start:
            # scheduling, interpreter, JAX, compilation); a restart's start is drawn as phases.
            begin = report.started if p.index == 0 else p.started
            bars.append(_Bar(job, begin, p.steps[0].start, "startup", "startup"))
        bars.append(
            _Bar(job, p.steps[0].start, p.steps[-1].ts, "training", f"training on {p.node or '?'}")
        )
    if len(report.ranks) > 1:
        bars += _rank_bars(report)
    for slow in report.slowdowns:
        # While the slow node was in the job: every step waited for it.
        last = report.processes[-1].end if report.processes else report.finished
        end = slow.stopped if slow.stopped is not None else last
        factor = f" {slow.factor:.1f}x" if slow.factor is not None else ""
        lost = f", {seconds(slow.lost_before_s)} lost" if slow.lost_before_s is not None else ""
        bars.append(
            _Bar(f"{slow.node} (slow)", slow.began, end, "slow", f"slow{factor}{lost}", "slow")
        )
    for inc in report.incidents:
        bars += _phase_bars(inc, job, report.finished)
        if inc.spare and inc.spare != inc.node and "spare_ready" in inc.marks:
            # A spare waits in the pool until it is promoted.
            bars.append(
                _Bar(
                    _spare_lane(inc),
                    report.started,
                    inc.marks["fault"],
                    "spare_held",
                    "held as a spare",
                )
            )
    return bars


def _rank_bars(report: Report) -> list[_Bar]:
    """One lane per process of the job: its runs' training, and for each incident the stall
    from the fault to that process stopped (a sliver for the one the fault killed)."""
    bars: list[_Bar] = []
    for rank, procs in enumerate(report.ranks):
        lane = f"rank {rank}"
        for p in procs:
            if p.steps:
                bars.append(_Bar(lane, p.started, p.steps[0].start, "startup", "startup"))
                bars.append(_Bar(lane, p.steps[0].start, p.steps[-1].ts, "training",
                                 f"training on {p.node or '?'}", p.node or ""))  # fmt: skip
        for inc in report.incidents:
            stop = inc.stopped[rank] if rank < len(inc.stopped) else None
            if stop is None:
                continue
            # At least a sliver, so a process killed outright by the fault shows too.
            end = max(stop, inc.fault_at + 0.05 * max(1.0, report.wall_s / 100))
            bars.append(_Bar(lane, inc.fault_at, end, "stall",
                             f"stopped {seconds(stop - inc.fault_at)}", ""))  # fmt: skip
    return bars


def _lanes(bars: Sequence[_Bar]) -> list[str]:
    """Failed nodes on top, then spares, the ranks, the job at the bottom (next to the step
    line)."""
    names = list(dict.fromkeys(b.lane for b in bars))
    return sorted(
        names,
        key=lambda n: (n.startswith("job "), n.startswith("rank "), "spare)" in n, names.index(n)),
    )


def _draw_lanes(ax: Axes, bars: Sequence[_Bar], lanes: Sequence[str], t0: float) -> list[Any]:
    """Draw the bars; returns their labels with the bar each belongs to, for :func:`_fit`."""
    y = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
    labels = []
    for b in bars:
        width = max(b.end - b.begin, 0.0)
        ax.broken_barh(
            [(b.begin - t0, width)],
            (y[b.lane] - 0.35, 0.7),
            facecolors=COLOURS[b.kind],
            edgecolor="#555555",
            linewidth=0.5,
            hatch="//" if b.kind == "out_of_service" else None,
        )
        if b.text:
            text = ax.text(
                b.begin - t0 + width / 2,
                y[b.lane],
                b.text,
                ha="center",
                va="center",
                fontsize=7.5,
                clip_on=True,
            )
            labels.append((text, b.short, b.begin - t0, b.end - t0))
    ax.set_yticks(list(y.values()), labels=list(y.keys()))
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    return labels


def _fit(fig: Figure, ax: Axes, labels: Sequence[Any]) -> None:
    """Shorten, or hide, every bar label wider than its bar (the legend still names the
    colour), once the layout is final and sizes are known in pixels."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for text, short, begin, end in labels:
        (x0, _), (x1, _) = ax.transData.transform([(begin, 0), (end, 0)])
        if text.get_window_extent(renderer).width + 4 <= x1 - x0:
            continue
        text.set_text(short)
        if not short or text.get_window_extent(renderer).width + 4 > x1 - x0:
            text.set_visible(False)


_MARKS: dict[str, dict[str, Any]] = {
    "checkpoint saved": {"marker": "v", "color": "black", "markersize": 5},
    "checkpoint restored": {"marker": "*", "color": "#2ca02c", "markersize": 12},
    "checkpoint failed verification": {"marker": "X", "color": "#d62728", "markersize": 9},
}


def _draw_steps(ax: Axes, report: Report, t0: float) -> None:
    """Step against time, one line per process; each line starts where its process began
    updating, at the step it started from (0, or the step it restored)."""
    used: list[str] = []

    def mark(name: str, xs: Sequence[float], ys: Sequence[float]) -> None:
        ax.plot(xs, ys, linestyle="none", **_MARKS[name])
        used.append(name)

    for p in report.processes:
        if not p.steps:
            continue
        label = f"process {p.index} on {p.node or '?'}"
        if p.restored_step is not None:
            label += f" (restored step {p.restored_step})"
        origin = p.restored_step if p.restored_step is not None else p.steps[0].step - 1
        xs = [p.steps[0].start - t0, *(s.ts - t0 for s in p.steps)]
        ax.plot(
            xs,
            [origin, *(s.step for s in p.steps)],
            marker=".",
            markersize=3,
            linewidth=1.2,
            label=label,
        )
        if p.checkpoints:
            mark(
                "checkpoint saved",
                [c.ts - t0 for c in p.checkpoints],
                [c.step for c in p.checkpoints],
            )
        if p.restored_at is None or p.restored_step is None:
            continue
        mark("checkpoint restored", [p.restored_at - t0], [p.restored_step])
        for f in p.fallbacks:
            mark("checkpoint failed verification", [p.restored_at - t0], [f.step])
            ax.annotate(
                f"step {f.step} failed verification: fell back to {p.restored_step}",
                (p.restored_at - t0, f.step),
                xytext=(-8, 6),
                ha="right",
                textcoords="offset points",
                fontsize=8,
                color="#d62728",
            )
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], linestyle="none", label=name, **_MARKS[name]) for name in dict.fromkeys(used)
    ]
    ax.legend(handles=handles, loc="best", fontsize=8, framealpha=0.9)
    ax.set_ylabel("training step")
    ax.grid(True, alpha=0.3)


def _draw_zoom(ax: Axes, inc: IncidentReport) -> None:
    """The coordinator's side (detection, the stacks of a stall, take-out, replacement) at its
    own scale: it lasts
    fractions of a second on an axis of minutes. A bar longer than the scale is cut, its
    length written beside it."""
    m, t0 = inc.marks, inc.fault_at
    rows = [
        ("detection", "fault", "noticed"),
        ("diagnose", "noticed", "stacks"),
        ("take_out", "decided", "node_out"),
        ("replacement", "fault", "spare_ready"),
    ]
    shown = [(k, m[a] - t0, m[b] - t0) for k, a, b in rows if a in m and b in m][::-1]
    quick = [b for k, _, b in shown if k != "replacement"]
    right = max(quick, default=1.0) * 3 if quick else max((b for *_, b in shown), default=1.0)
    right = max(right, max((b for *_, b in shown if b <= right), default=0.0) * 1.3, 1e-3)
    for i, (kind, a, b) in enumerate(shown):
        cut = min(b, right * 0.8)
        ax.barh(i, cut - a, left=a, color=COLOURS[kind], edgecolor="#555555", linewidth=0.5)
        more = " (cut)" if cut < b else ""
        ax.text(cut, i, f" {seconds(b - a)}{more}", va="center", fontsize=7.5)
    ax.set_yticks(range(len(shown)), labels=[k.replace("_", " ") for k, _, _ in shown])
    ax.set_xlim(-0.05 * right, right)
    ax.axvline(0, color="#d62728", linestyle="--", linewidth=1)
    ax.set_title("the first moments, zoomed", fontsize=9)
    ax.set_xlabel("seconds from the fault", fontsize=8)
    ax.tick_params(labelsize=7.5)


def _shade_no_progress(ax: Axes, inc: IncidentReport, t0: float) -> None:
    """The stretch without new progress, from the last update before the restart to the
    first one past it."""
    a, b = inc.marks.get("last_step_before"), inc.marks.get("progress")
    if a is None or b is None:
        return
    ax.axvspan(a - t0, b - t0, color="#d62728", alpha=0.07, linewidth=0)
    ax.annotate(
        f"no progress {seconds(b - a)}",
        ((a + b) / 2 - t0, 0.5),
        xycoords=("data", "axes fraction"),
        ha="center",
        fontsize=9,
        color="#b71c1c",
    )


def _title(report: Report) -> str:
    name = report.scenario or "run started by hand"
    if not report.journal_known:
        return (
            f"{name}: {len(report.restarts)} restart(s), "
            f"{report.steps_recomputed} step(s) redone ({report.job.label}, "
            f"{report.wall_s:.1f} s; no journal: from the job's events)"
        )
    if not report.incidents:
        return f"{name}: no incident ({report.job.label}, {report.wall_s:.1f} s)"
    inc = report.incidents[0]
    where = f"{inc.fault} on {inc.node}"
    if inc.ran_on:
        slow = next((s for s in report.slowdowns if s.node == inc.node), None)
        cost = (
            f"; {seconds(slow.total_s)} lost to it"
            if slow is not None and slow.total_s is not None
            else ""
        )
        return f"{where}: {inc.verdict}, the job trained on{cost}"
    if inc.recovery_s is None:
        why = inc.why.get("replacement") or inc.why.get("warmup", "")
        return f"{where}: the job did not train again before the run ended ({why})"
    if report.scenario != inc.fault:
        where = f"{name}: {where}"
    if len(report.incidents) > 1:
        where += f" (+{len(report.incidents) - 1} more incident(s))"
    again = seconds(inc.recovery_s) if inc.recovery_s is not None else "never"
    spare = (
        f"spare ready after {seconds(inc.phases['replacement'])}"
        if inc.phases["replacement"] is not None
        else "no spare promoted"
    )
    lost = inc.steps_recomputed if inc.steps_recomputed is not None else "?"
    return f"{where}: training again after {again}, {lost} step(s) redone; {spare}"


def _phase_legend(ax: Axes, kinds: Sequence[str], inc: IncidentReport | None) -> None:
    """The colours, each incident phase with its length in the (first) incident."""

    def label(kind: str) -> str:
        name = _LABELS.get(kind, kind.replace("_", " "))
        length = inc.phases.get(kind) if inc else None
        return f"{name} ({seconds(length)})" if length is not None else name

    ax.axis("off")
    patches = [
        Patch(
            facecolor=COLOURS[k],
            edgecolor="#555555",
            label=label(k),
            hatch="//" if k == "out_of_service" else None,
        )
        for k in kinds
    ]
    ax.legend(handles=patches, loc="center left", fontsize=8.5, title="phases", title_fontsize=9)


def render_png(report: Report, *, dpi: int = 110) -> bytes:
    """The timeline of ``report`` as PNG bytes (1430 x 858 pixels at the default dpi)."""
    fig = Figure(figsize=(13, 7.8), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, width_ratios=(4.2, 1), height_ratios=(1, 1.25))
    lanes_ax = fig.add_subplot(grid[0, 0])
    steps_ax = fig.add_subplot(grid[1, 0], sharex=lanes_ax)
    t0 = report.incidents[0].fault_at if report.incidents else report.started
    bars = _bars(report)
    labels = _draw_lanes(lanes_ax, bars, _lanes(bars) or [report.job.label], t0)
    _draw_steps(steps_ax, report, t0)
    for inc in report.incidents:
        _shade_no_progress(steps_ax, inc, t0)
        for ax in (lanes_ax, steps_ax):
            ax.axvline(inc.fault_at - t0, color="#d62728", linestyle="--", linewidth=1.2)
        steps_ax.annotate(
            f"fault: {inc.fault} on {inc.node}",
            (inc.fault_at - t0, 0.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, 6),
            textcoords="offset points",
            color="#d62728",
            fontsize=8.5,
        )
    steps_ax.set_xlim(report.started - t0, report.finished - t0)
    origin = "the fault" if report.incidents else "the run's start"
    steps_ax.set_xlabel(f"seconds from {origin} ({time.strftime('%H:%M:%S UTC', time.gmtime(t0))})")
    lanes_ax.tick_params(labelbottom=False)
    lanes_ax.grid(True, axis="x", alpha=0.3)
    lanes_ax.set_title("phases per node", fontsize=10, loc="left")
    if report.incidents:
        _draw_zoom(fig.add_subplot(grid[0, 1]), report.incidents[0])
    first = report.incidents[0] if report.incidents else None
    _phase_legend(fig.add_subplot(grid[1, 1]), list(dict.fromkeys(b.kind for b in bars)), first)
    fig.suptitle(_title(report), fontsize=12, fontweight="bold")
    _fit(fig, lanes_ax, labels)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def render_modes_png(runs: Sequence[tuple[str, Report]], *, dpi: int = 110) -> bytes:
    """The same fault recovered in several modes, as PNG bytes: one panel of phase lanes per
    mode, then the step lines of every mode's process 0, all on one axis of seconds from each
    run's fault (the fault at 0 in every panel)."""
    n = len(runs)
    fig = Figure(figsize=(13, 3.2 * n + 3.6), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(n + 1, 2, width_ratios=(4.2, 1), height_ratios=(*([1] * n), 1.1))
    steps_ax = fig.add_subplot(grid[n, 0])
    kinds: list[str] = []
    left, right = 0.0, 0.0
    fitted = []
    for row, (mode, report) in enumerate(runs):
        ax = fig.add_subplot(grid[row, 0], sharex=steps_ax)
        t0 = report.incidents[0].fault_at if report.incidents else report.started
        bars = _bars(report)
        kinds += [b.kind for b in bars]
        labels = _draw_lanes(ax, bars, _lanes(bars) or [report.job.label], t0)
        fitted.append((ax, labels))
        ax.axvline(0, color="#d62728", linestyle="--", linewidth=1.2)
        ax.tick_params(labelbottom=False)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(f"{mode}: {_title(report)}", fontsize=10, loc="left")
        left, right = min(left, report.started - t0), max(right, report.finished - t0)
        line = None
        for p in report.processes:  # process 0's runs (each process's: the lanes above)
            if not p.steps:
                continue
            origin = p.restored_step if p.restored_step is not None else p.steps[0].step - 1
            xs = [p.steps[0].start - t0, *(s.ts - t0 for s in p.steps)]
            (line,) = steps_ax.plot(
                xs,
                [origin, *(s.step for s in p.steps)],
                color=line.get_color() if line is not None else None,
                marker=".",
                markersize=3,
                linewidth=1.2,
                label=None if line is not None else mode,
            )
            if p.restored_at is not None and p.restored_step is not None:
                steps_ax.plot([p.restored_at - t0], [p.restored_step], linestyle="none",
                              **_MARKS["checkpoint restored"])  # fmt: skip
    steps_ax.axvline(0, color="#d62728", linestyle="--", linewidth=1.2)
    steps_ax.set_xlim(left, right)
    steps_ax.set_xlabel("seconds from the fault")
    steps_ax.set_ylabel("training step (process 0)")
    steps_ax.grid(True, alpha=0.3)
    handles, _ = steps_ax.get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle="none", label="restored (memory or checkpoint)",
                          **_MARKS["checkpoint restored"]))  # fmt: skip
    steps_ax.legend(handles=handles, loc="best", fontsize=8, framealpha=0.9)
    _phase_legend(fig.add_subplot(grid[:, 1]), list(dict.fromkeys(kinds)), None)
    fault = runs[0][1].incidents[0] if runs and runs[0][1].incidents else None
    what = f"{fault.fault} on a job node" if fault else "no fault"
    fig.suptitle(f"{what}: {' vs '.join(m for m, _ in runs)}", fontsize=12, fontweight="bold")
    for ax, labels in fitted:
        _fit(fig, ax, labels)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
