"""A slow node's cost, and what swapping it out saves, on the real local cluster: the shipped
``slow-node`` scenario in-allocation (4 ``recover train`` processes of mlp-medium plus one
spare node in the job; node2's process held to 10 % of a CPU at step 30), its job made
``--steps`` long (320: detection and a relaunch cost about the same whatever the length, so
a short job hides what a swap saves), run N times in each of three ways:

* **healthy**: the same job with no fault (the scenario file with ``faults: []``);
* **left in**: the slow node is reported (``node-slow``) and kept, the default;
* **swapped**: the job asks for swaps (``RECOVER_STALL_BUDGETS='{"straggler": {"swap":
  true}}'``): its supervisor relaunches without the slow node, on the job's spare, from the
  survivors' memory, when that saves more than a relaunch costs.

    .venv/bin/python -m benchmarks.straggler_bench [--runs 5] [--steps 320] [--slurm auto]
        [--mode in-allocation|requeue] [--ways healthy,left-in,swapped] [--with old.json]
        [--out DIR] [--json out.json]

``--mode requeue`` runs the job without a spare of its own: a swap is then the requeue
path's move (the agent's ``node-slow-swap``: node2 drained, the job saved and requeued onto
the pool's spare). ``--ways`` runs only some of the ways; ``--with`` adds the rows of an
earlier ``--json`` (the healthy runs, say) to the summary.

Each run's **job wall time** is process 0's first ``started`` -> last ``completed`` event of
the training (every relaunch included). Printed: the p50 (and worst) of each way, their ratio
to healthy against the issue's target (swapped <= 1.2x healthy where leaving the node in
costs about 2x), when the slow node was named (``node-slow`` decided, seconds after the
throttle), and whether each run passed its scenario's expectations. Needs root (the local
cluster and the CPU quota).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from scenarios.loader import find

SCENARIO = "slow-node"
TARGET_SWAPPED = 1.2
WAYS = ("healthy", "left-in", "swapped")
SWAP = json.dumps({"straggler": {"swap": True}})


#: What a move on the requeue path must show (the scenario's own expectations are the report
#: only case's).
MOVED = {
    "incidents": 1,
    "verdicts": ["drain-reset"],
    "incident_nodes": ["node2"],
    "out_of_service": ["node2"],
    "max_requeues": 1,
}


def scenario_files(directory: Path, steps: int, mode: str = "in-allocation") -> dict[str, str]:
    """The scenario with its job ``steps`` long, and the same without its fault (the job it
    slows, undisturbed), as files in ``directory``; by way. On the requeue path the swapped
    way expects the move (:data:`MOVED`)."""
    found = find(SCENARIO)
    assert found.path is not None
    doc = yaml.safe_load(found.path.read_text())
    doc["job"]["steps"] = steps
    doc["job"]["save_every"] = max(1, steps // 2)
    doc["timeout_s"] = max(int(doc.get("timeout_s", 300)), 6 * steps)
    slow = directory / "slow-node.yaml"
    slow.write_text(yaml.safe_dump(doc, sort_keys=False))
    swapped = slow
    if mode == "requeue":
        swapped = directory / "slow-node-moved.yaml"
        swapped.write_text(yaml.safe_dump({**doc, "expect": MOVED}, sort_keys=False))
    doc["faults"] = []
    doc["expect"] = {"incidents": 0, "max_requeues": 0}
    doc["description"] = "slow-node's job with no fault (straggler_bench's baseline)"
    healthy = directory / "slow-node-healthy.yaml"
    healthy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return {"healthy": str(healthy), "left-in": str(slow), "swapped": str(swapped)}


def one_run(way: str, scenario: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("RECOVER_STALL_BUDGETS", None)
    if way == "swapped":
        env["RECOVER_STALL_BUDGETS"] = SWAP
    cmd = [sys.executable, "-m", "recover", "scenario", "run", scenario, "--out", str(out),
           "--json", "--no-budgets", "--slurm", args.slurm, "--mode", args.mode]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False, env=env)
    result = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    row: dict[str, Any] = {"way": way, "passed": bool(result.get("passed"))}
    if not row["passed"]:
        row["error"] = done.stderr[-800:]
    row["wall_s"] = _job_wall(out / "job" / "events.jsonl")
    row.update(_noticed(out))
    row.update(_moved(out))
    journal = out / "supervisor-1.jsonl"
    if journal.exists():
        events = [json.loads(line) for line in journal.read_text().splitlines()]
        slow = [e for e in events if e["event"] == "slow"]
        row["swap"] = [e["swap"] for e in slow]
        row["why"] = [e["why"] for e in slow]
        row["relaunches"] = sum(e["event"] == "relaunch" for e in events)
    return row


def _job_wall(events: Path) -> float | None:
    """Process 0's first ``started`` to its last ``completed`` (seconds)."""
    if not events.exists():
        return None
    rows = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    started = [e["ts"] for e in rows if e.get("event") == "started"]
    completed = [e["ts"] for e in rows if e.get("event") == "completed"]
    return completed[-1] - started[0] if started and completed else None


def _noticed(out: Path) -> dict[str, Any]:
    """Seconds from the throttle to the coordinator's node-slow decision."""
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    for inc in report.get("incidents") or []:
        marks = inc.get("marks") or {}
        if inc.get("fault") == "node-slow" and "decided" in marks and "fault" in marks:
            return {"noticed_s": marks["decided"] - marks["fault"], "node": inc.get("node")}
    return {}


def _moved(out: Path) -> dict[str, Any]:
    """On the requeue path: whether the coordinator moved the job (a node-slow-swap)."""
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    verdicts = [inc.get("verdict") for inc in report.get("incidents") or []]
    return {"moved": "drain-reset" in verdicts} if verdicts else {}


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} s (worst {max(values):7.1f} s)" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--slurm", default="auto")
    parser.add_argument(
        "--steps", type=int, default=320, help="the job's length (the scenario's is 160)"
    )
    parser.add_argument("--mode", choices=("in-allocation", "requeue"), default="in-allocation")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated: " + ",".join(WAYS))
    parser.add_argument("--with", dest="earlier", type=Path, help="rows of an earlier --json")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        parser.error(f"unknown way(s) {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    base = args.out or Path(tempfile.mkdtemp(prefix="straggler-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    scenarios = scenario_files(base, args.steps, args.mode)
    rows = json.loads(args.earlier.read_text())["rows"] if args.earlier else []
    for i in range(args.runs):
        for way in ways:
            row = one_run(way, scenarios[way], base / f"{way}-{i}", args)
            rows.append(row)
            print(f"  run {i + 1}/{args.runs} {way}: {json.dumps(row)[:400]}", file=sys.stderr)
    spare = "1 spare in the job" if args.mode == "in-allocation" else "1 spare in the pool"
    print(f"slow node (10 % of a CPU on node2's process from step 30), mlp-medium to step "
          f"{args.steps}, 4 processes + {spare}, {args.mode}, {args.runs} run(s) of "
          f"{', '.join(ways)} (runs in {base})")  # fmt: skip
    # A run that failed its scenario (say, its job requeued by a broken tree) is no measure.
    walls = {
        w: [r["wall_s"] for r in rows if r["way"] == w and r.get("wall_s") and r["passed"]]
        for w in WAYS
    }
    healthy = statistics.median(walls["healthy"]) if walls["healthy"] else None
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        ratio = ""
        if healthy and walls[way]:
            ratio = f"{statistics.median(walls[way]) / healthy:5.2f}x healthy"
            if way == "swapped":
                ratio += f" (target <= {TARGET_SWAPPED:g}x)"
        passed = sum(r["passed"] for r in mine)
        print(f"  {way:<8} job wall {_p50(walls[way])}  {ratio}  passed {passed}/{len(mine)}")
    noticed = [r["noticed_s"] for r in rows if r.get("noticed_s") is not None]
    print(f"  node-slow decided {_p50(noticed)} after the throttle")
    swaps = [r.get("swap", r.get("moved")) for r in rows if r["way"] == "swapped"]
    print(f"  swapped runs' decisions: {swaps}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "target_swapped": TARGET_SWAPPED}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
