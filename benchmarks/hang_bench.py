"""Hang -> noticed -> training again, on the real local cluster: the shipped scenarios whose
training process stops making progress without exiting, run N times each.

    .venv/bin/python -m benchmarks.hang_bench [--runs 5] [--slurm 25.11]
        [--scenario main-thread-hang --scenario process-freeze] [--mode requeue]
        [--out DIR] [--json out.json]

Each run is ``recover scenario run NAME --no-budgets`` (a 4-process ``recover train`` job with
0.5 s steps; its own cluster, coordinator and one agent per node; ``main-thread-hang`` blocks
process 1's main thread in a system call with gdb, ``process-freeze`` SIGSTOPs it). From each
run's report (``report.json``, the incident's marks) it takes:

* **noticed**: the fault -> the first to act saw it: the coordinator deciding on the agent's
  report (rank-hang / rank-frozen) on the requeue path, the job's supervisor seeing the stall
  in-allocation (the report's ``noticed`` mark); the time a hang costs before anything
  happens;
* **training again**: the fault -> the job's first step after the restart;
* **restart**: noticed -> training again (in-allocation: the supervisor ending the stalled
  launch after the stacks and relaunching it on the standbys; requeue: the requeue);
* **steps recomputed**.

Printed: p50 and the worst run of each, against the targets (issue 27: noticed p50 <= 10 s;
training again <= 20 s on the requeue path on Slurm 25.11, <= 5 s with ``--mode
in-allocation``); and whether every run passed its
scenario's expectations (the culprit named, the job completing with the control's digest).
Needs root (the local cluster runs as root).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The issue's targets by path: hang -> training again <= 20 s on the requeue path (25.11),
#: <= 5 s in-allocation (where the step-loop budget alone is 5 s: see benchmarks/README.md).
TARGETS = {
    "requeue": {"noticed_s": 10.0, "training_again_s": 20.0},
    "in-allocation": {"noticed_s": 10.0, "training_again_s": 5.0},
}
SCENARIOS = ("main-thread-hang", "process-freeze")


def one_run(name: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "recover", "scenario", "run", name, "--out", str(out),
           "--json", "--no-budgets", "--slurm", args.slurm, "--mode", args.mode]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    result = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    report = json.loads((out / "report.json").read_text())
    incidents = report.get("incidents") or []
    row: dict[str, Any] = {"scenario": name, "passed": bool(result.get("passed"))}
    if not incidents:
        return row | {"error": "no incident: " + done.stderr[-500:]}
    inc = incidents[0]
    marks = inc.get("marks") or {}
    fault = marks.get("fault")
    if fault is None:
        return row | {"error": "no fault time in the report"}
    noticed = "noticed" if "noticed" in marks else "decided"  # reports before the supervisor's
    row.update(
        fault=inc.get("fault"),
        node=inc.get("node"),
        noticed_s=marks[noticed] - fault if noticed in marks else None,
        training_again_s=marks["first_step"] - fault if "first_step" in marks else None,
        restart_s=(
            marks["first_step"] - marks[noticed]
            if "first_step" in marks and noticed in marks
            else None
        ),
        steps_recomputed=inc.get("steps_recomputed"),
    )
    return row


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {statistics.median(values):6.2f} s   worst {max(values):6.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--slurm", default="25.11")
    parser.add_argument("--mode", default="requeue", choices=("requeue", "in-allocation"))
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = args.scenario or list(SCENARIOS)
    base = args.out or Path(tempfile.mkdtemp(prefix="hang-bench-"))
    rows = []
    for i in range(args.runs):
        for name in names:
            row = one_run(name, base / f"{name}-{i}", args)
            rows.append(row)
            print(f"  run {i + 1}/{args.runs} {name}: {json.dumps(row)}", file=sys.stderr)
    print(f"hang -> noticed -> training again, Slurm {args.slurm}, {args.mode} path, "
          f"{args.runs} run(s) each (runs in {base})")  # fmt: skip
    for name in names:
        mine = [r for r in rows if r["scenario"] == name]
        passed = sum(r["passed"] for r in mine)
        print(f"{name}: {passed}/{len(mine)} passed its expectations; culprits "
              f"{sorted({(r.get('fault'), r.get('node')) for r in mine}, key=str)}")  # fmt: skip
        for key, target in TARGETS[args.mode].items():
            values = [r[key] for r in mine if r.get(key) is not None]
            ratio = f"{statistics.median(values) / target:.2f}x the target" if values else ""
            print(f"  {key:<17} {_summary(values)}   target p50 <= {target:g} s  {ratio}")
        restart = [r["restart_s"] for r in mine if r.get("restart_s") is not None]
        print(f"  {'restart_s':<17} {_summary(restart)}   (noticed -> training again)")
        steps = [r["steps_recomputed"] for r in mine if r.get("steps_recomputed") is not None]
        print(f"  steps recomputed  {steps}")
    if args.json:
        targets = TARGETS[args.mode]
        args.json.write_text(json.dumps({"rows": rows, "targets": targets}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
