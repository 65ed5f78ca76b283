"""Recovery time, phase by phase: the xid79 scenario run N times on the real local cluster
as a K-process job (one process per node, K=4) and as a single process, side by side, and the
empty-spare-pool scenario for contrast.

    .venv/bin/python -m benchmarks.recovery_bench [--runs 10] [--single-runs N]
        [--contrast-runs 3] [--processes 4] [--scenario xid79] [--contrast no-spare]
        [--slurm auto|25.11|22.05] [--mode requeue|in-allocation|both] [--out DIR]
        [--json out.json]

The fault is the real one (DESIGN.md): the training process on the faulted node is
SIGABRTed (no save) while slurmd, the batch shell and the other processes live on; the others
stop by themselves (``stall``: fault -> every process stopped), the job ends FAILED and the
coordinator requeues it. ``--single-runs`` (default: ``--runs``) runs the same scenario with
``job.processes: 1`` for the single-process figure; 0 skips it.

``--slurm`` picks the local cluster's Slurm (as ``recover scenario run --slurm``): on 22.05 a
requeued job waits for its old credential to expire (``requeue_wait`` >= cred_expire + 1 s);
on 25.11 the job is submitted with ``--requeue=expedite`` and starts again at once.

Each run is a whole scenario (`recover scenario run`): a fresh local Slurm cluster with the
coordinator and one agent per node, a real JAX job on every in-service node, the fault
injected through the agent's real detection path, the report built from the journal and the
job's events. The control run the digest is compared with is computed (or found in the cache)
before the first measured run, so it never competes with one for the CPU.

Printed per phase: median, the spread (min, quartiles, max) and the median's share of
"fault -> training again" (the chain: the later of stall or detection + take_out, then
requeue_wait + job_restart + restore + warmup, which sums to it exactly; each run's report
names its chain); replacement runs beside the chain, recompute and no_progress are shown
for the cost. Then stall p50/p99 and steps recomputed for K processes and for one. Then the
target (fault -> training again under 20 s, the median) and what bounds the biggest phase.
Needs root (the local cluster runs as root).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios.control import control_digest
from scenarios.loader import Loaded, find, with_mode
from scenarios.runner import RunOptions, run
from service.wiring import SlurmAccess
from slurm.conf import ClusterLayout

CHAIN = ("detection", "stall", "take_out", "requeue_wait", "job_restart", "restore", "warmup")
BESIDE = ("replacement", "recompute", "no_progress")
TARGET_S = 20.0


@dataclass
class Series:
    """The measured runs of one scenario."""

    name: str
    phases: dict[str, list[float]] = field(default_factory=dict)
    recovery: list[float] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    elapsed: list[float] = field(default_factory=list)
    chains: list[str] = field(default_factory=list)
    """Each run's chain of phases (``stall`` or ``detection+take_out`` first)."""

    def add(self, report: dict[str, Any], elapsed_s: float) -> None:
        self.elapsed.append(elapsed_s)
        incidents = [i for i in report.get("incidents", []) if i.get("interrupted", True)]
        if not incidents:
            self.failed.append("no incident interrupted the job")
            return
        first = incidents[0]
        for name, value in first["phases"].items():
            if value is not None:
                self.phases.setdefault(name, []).append(float(value))
        if first.get("recovery_s") is not None:
            self.recovery.append(float(first["recovery_s"]))
        if first.get("steps_recomputed") is not None:
            self.recomputed.append(int(first["steps_recomputed"]))
        self.chains.append("+".join(first.get("chain") or ()))


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def table(series: Series) -> str:
    total = statistics.median(series.recovery) if series.recovery else float("nan")
    head = f"{'phase':<14}{'n':>3}{'median s':>10}" + "".join(
        f"{h:>8}" for h in ("min", "q1", "q3", "max", "share")
    )
    rows = [head, "-" * len(head)]
    for name in (*CHAIN, "= recovery", *BESIDE):
        values = series.recovery if name == "= recovery" else series.phases.get(name, [])
        if not values:
            rows.append(f"{name:<14}{0:>3}{'-':>10}   (none: {_why_none(name, series)})")
            continue
        med = statistics.median(values)
        q1, q3 = _quartiles(values)
        share = f"{med / total:7.0%}" if name in CHAIN and total > 0 else "       "
        rows.append(
            f"{name:<14}{len(values):>3}{med:>10.2f}{min(values):>8.2f}{q1:>8.2f}{q3:>8.2f}"
            f"{max(values):>8.2f} {share}"
        )
    if series.recomputed:
        rows.append(
            f"steps recomputed: median {statistics.median(series.recomputed):g}, "
            f"max {max(series.recomputed)}"
        )
    if series.failed:
        rows.append(f"runs with a failed expectation or no incident: {len(series.failed)}")
        rows += [f"  - {f}" for f in series.failed[:5]]
    return "\n".join(rows)


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (inclusive method; with few runs p99 is close to the max)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def side_by_side(many: Series, one: Series | None, processes: int) -> str:
    """fault -> training again, stall p50/p99 and steps recomputed: K processes against one."""
    cols = [(f"{processes} processes", many)] + ([("1 process", one)] if one else [])
    return columns(cols)


def columns(cols: list[tuple[str, Series]], idle: list[int] | None = None) -> str:
    """The side-by-side rows for each ``(label, series)``; ``idle``: nodes each column's job
    holds idle the whole time (the modes' table)."""
    width = max(16, *(len(c) + 2 for c, _ in cols))
    head = f"{'':<28}" + "".join(f"{c:>{width}}" for c, _ in cols)
    rows = [head, "-" * len(head)]

    def cell(values: list[float], fn: str) -> str:
        if not values:
            return f"{'-':>{width}}"
        v = {"p50": percentile(values, 50), "p99": percentile(values, 99)}[fn]
        return f"{v:>{width - 2}.2f} s"

    rows_of = [
        ("fault -> training again p50", "recovery", "p50"),
        ("fault -> training again p99", "recovery", "p99"),
        ("stall p50", "stall", "p50"),
        ("stall p99", "stall", "p99"),
    ]
    if idle is not None:
        rows_of += [("requeue_wait p50", "requeue_wait", "p50"),
                    ("job_restart p50", "job_restart", "p50"),
                    ("warmup p50", "warmup", "p50")]  # fmt: skip
    for label, key, fn in rows_of:
        rows.append(f"{label:<28}" + "".join(
            cell(s.recovery if key == "recovery" else s.phases.get(key, []), fn)
            for _, s in cols
        ))  # fmt: skip
    rows.append(f"{'steps recomputed (median)':<28}" + "".join(
        f"{statistics.median(s.recomputed) if s.recomputed else '-':>{width}}" for _, s in cols
    ))  # fmt: skip
    if idle is not None:
        rows.append(f"{'nodes held idle by the job':<28}" + "".join(
            f"{n:>{width}}" for n in idle))  # fmt: skip
    rows.append(f"{'runs (failed)':<28}" + "".join(
        f"{f'{len(s.elapsed)} ({len(s.failed)})':>{width}}" for _, s in cols))  # fmt: skip
    return "\n".join(rows)


def _why_none(name: str, series: Series) -> str:
    if name == "stall":
        return "no process of the job was left to stop"
    if name == "replacement":
        return "no spare was promoted in any run"
    return "not measured in any run"


def measure(
    loaded: Loaded, runs: int, out: Path, cache: Path, label: str, slurm: str | None = None
) -> Series:
    series = Series(loaded.scenario.name)
    for i in range(runs):
        run_out = out / f"{label}-{i + 1:02d}"
        t0 = time.monotonic()
        print(f"{label} run {i + 1}/{runs} -> {run_out}", flush=True)
        result = run(
            loaded,
            RunOptions(
                out=run_out,
                cache=cache,
                say=lambda _line: None,
                enforce_budgets=False,
                slurm=SlurmAccess(slurm=slurm),
            ),
        )
        elapsed = time.monotonic() - t0
        report_path = run_out / "report.json"
        if not report_path.is_file():
            series.failed.append(f"run {i + 1}: no report ({result.failed})")
            continue
        series.add(json.loads(report_path.read_text()), elapsed)
        if not result.passed:
            series.failed.append(
                f"run {i + 1}: " + "; ".join(f"{c.name}: {c.detail}" for c in result.failed)
            )
        last = series.recovery[-1] if series.recovery else float("nan")
        print(f"  fault -> training again {last:.2f} s; whole run {elapsed:.0f} s", flush=True)
    return series


def verdict(main: Series, expedited: bool = False) -> list[str]:
    lines = []
    if not main.recovery:
        return ["[MISSED] fault -> training again: no run measured it"]
    med = statistics.median(main.recovery)
    mark = "met" if med < TARGET_S else "MISSED"
    lines.append(
        f"[{mark}] fault -> training again, median {med:.2f} s < {TARGET_S:.0f} s: "
        f"{med / TARGET_S:.2f}x of the target"
    )
    medians = {p: statistics.median(v) for p, v in main.phases.items() if p in CHAIN and v}
    if medians:
        top = max(medians, key=lambda p: medians[p])
        share = medians[top] / med
        lines.append(f"largest phase: {top}, median {medians[top]:.2f} s ({share:.0%})")
    bound = ClusterLayout.cred_expire_s + 1
    if "requeue_wait" in medians and expedited:
        lines.append(
            f"requeue_wait with Slurm 25.11's expedited requeue (no credential wait): measured "
            f"median {medians['requeue_wait']:.2f} s (22.05 waits cred_expire + 1 = {bound} s)"
        )
    elif "requeue_wait" in medians:
        lines.append(
            f"requeue_wait is bounded below by Slurm: a requeued batch job may start only after "
            f"its old launch credential expired (cred_expire + 1 = {bound} s on the local "
            f"cluster); measured median {medians['requeue_wait']:.2f} s"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--single-runs", type=int, default=None)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--contrast-runs", type=int, default=3)
    ap.add_argument("--scenario", default="xid79")
    ap.add_argument("--contrast", default="no-spare")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=Path(".state/scenario-cache"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--slurm", default=None, help="auto (25.11 when built), 25.11 or 22.05 [$RECOVER_SLURM]"
    )
    ap.add_argument(
        "--mode", choices=("requeue", "in-allocation", "both"), default="requeue",
        help="the job's recovery mode; both: the scenario in each, side by side, and, when "
        "--slurm is not 25.11 but 25.11 is built, the expedited requeue as a third column",
    )  # fmt: skip
    args = ap.parse_args(argv)
    out = args.out or Path("runs") / f"recovery-bench-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)

    base, contrast = find(args.scenario), find(args.contrast)
    main_s, single = _with_processes(base, args.processes), _with_processes(base, 1)
    if args.mode == "in-allocation":
        main_s = with_mode(main_s, "in-allocation")
    if args.mode == "both":
        return _both_modes(main_s, args, out)
    single_runs = args.runs if args.single_runs is None else args.single_runs
    contrast_k = contrast.scenario.job.process_count(contrast.scenario.cluster.nodes)
    controls = [(main_s, args.processes, args.runs), (single, 1, single_runs),
                (contrast, contrast_k, args.contrast_runs)]  # fmt: skip
    for loaded, k, runs in controls:
        if not runs:
            continue  # no run of it: no control needed
        print(f"control run for {loaded.scenario.name}, {k} process(es) (cached after the "
              "first time)", flush=True)  # fmt: skip
        control_digest(loaded.scenario.job, args.cache, processes=k)
    measured = measure(main_s, args.runs, out, args.cache, main_s.scenario.name, args.slurm)
    one = (
        measure(single, single_runs, out, args.cache, f"{base.scenario.name}-1p", args.slurm)
        if single_runs
        else None
    )
    other = (
        measure(contrast, args.contrast_runs, out, args.cache, contrast.scenario.name, args.slurm)
        if args.contrast_runs
        else None
    )

    from slurm.install import choose

    print(f"\n{main_s.scenario.name}, {args.processes} processes: {args.runs} runs on "
          f"{choose(args.slurm).describe()}")  # fmt: skip
    print(table(measured))
    if one is not None:
        print(f"\n{base.scenario.name}, 1 process: {single_runs} runs")
        print(table(one))
    print(f"\nside by side (load average {_load()})")
    print(side_by_side(measured, one, args.processes))
    if other is not None:
        print(f"\n{contrast.scenario.name} (contrast): {args.contrast_runs} runs")
        print(table(other))
    print()
    for line in verdict(measured, expedited=choose(args.slurm).series >= (25, 11)):
        print(line)
    if args.json:
        doc = {
            "scenario": measured.__dict__,
            "single": one.__dict__ if one else None,
            "contrast": other.__dict__ if other else None,
            "target_s": TARGET_S,
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0 if measured.recovery and not measured.failed else 1


def _both_modes(loaded: Loaded, args: argparse.Namespace, out: Path) -> int:
    """The scenario requeued and in-allocation (and expedited on 25.11), side by side."""
    from slurm.install import build, choose

    inalloc = with_mode(loaded, "in-allocation")
    held = inalloc.scenario.job.job_spares
    plan: list[tuple[str, Loaded, str | None, list[int]]] = [
        (f"requeue, Slurm {choose(args.slurm).version}", loaded, args.slurm, [0]),
        ("in-allocation", inalloc, args.slurm, [held]),
    ]
    if choose(args.slurm).series < (25, 11) and build() is not None:
        plan.append(("requeue, 25.11 expedited", loaded, "25.11", [0]))
    control_digest(loaded.scenario.job, args.cache, processes=args.processes)
    measured = []
    for label, what, slurm, _ in plan:
        tag = label.replace(", ", "-").replace(" ", "-").replace(".", "")
        measured.append((label, measure(what, args.runs, out, args.cache, tag, slurm)))
    print(f"\n{loaded.scenario.name}, {args.processes} processes, {args.runs} runs per mode "
          f"(load average {_load()})")  # fmt: skip
    print(columns(measured, idle=[p[3][0] for p in plan]))
    for label, series in measured:
        print(f"\n{label}:")
        print(table(series))
    print()
    times = {label: statistics.median(s.recovery) for label, s in measured if s.recovery}
    if len(times) >= 2:
        best = min(times, key=lambda k: times[k])
        print(
            f"fastest back to training: {best} ({times[best]:.2f} s median); "
            + ", ".join(f"{k} {v / times[best]:.2f}x" for k, v in times.items() if k != best)
        )
    print(f"in-allocation holds {held} node(s) idle for the whole job; the requeue modes hold "
          "none (their replacement comes from the pool's spares)")  # fmt: skip
    if args.json:
        doc = {label: s.__dict__ for label, s in measured}
        args.json.write_text(json.dumps(doc, indent=2))
    ok = all(s.recovery and not s.failed for _, s in measured)
    return 0 if ok else 1


def _with_processes(loaded: Loaded, processes: int) -> Loaded:
    """``loaded`` with its job run as ``processes`` processes (one per node)."""
    s = loaded.scenario
    job = s.job.model_copy(update={"processes": processes})
    return Loaded(s.model_copy(update={"job": job}), loaded.text, loaded.path)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


if __name__ == "__main__":
    sys.exit(main())
