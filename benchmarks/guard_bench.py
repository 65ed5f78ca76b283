"""False incidents on the real local cluster: the guard scenarios, whose job goes through a
legitimately long phase with nothing wrong, run N times each.

    .venv/bin/python -m benchmarks.guard_bench [--runs 5] [--baseline-runs 2] [--slurm auto]
        [--mode requeue] [--scenario guard-slow-save --scenario ...] [--out DIR]
        [--json out.json]

Each run is ``recover scenario run NAME --no-budgets`` (a 4-process ``recover train`` job with
0.5 s steps; its own cluster, coordinator and one agent per node): ``guard-slow-save``
(process 0 spends 15 s more in its step-16 save while the others wait at the next step),
``guard-long-eval`` (process 0 evaluates for 15 s after step 16), ``guard-pause`` (every
process paused 15 s after step 16), ``guard-slow-compile`` (every process's first step 75 s
longer, unannounced). Each phase lasts more than twice the step budget the agents have
learned by then. From each run it takes:

* **false incidents**: the incidents the coordinator opened (every one is false: nothing
  went wrong), with their faults;
* **training time**: process 0's ``warmup`` -> ``completed`` events (from the end of its
  compile to its end: the start-up, which varies by seconds on a busy machine, left out; a
  lazy compile's slow first step falls in it);
* whether the run passed its scenario's expectations (no incident, no requeue, the control's
  digest).

The same job without the long phase (the scenario file with ``job.long_phases`` removed)
runs ``--baseline-runs`` times, once per distinct job, for the training time to compare
with: the difference is what the long phase cost, which should be the phase itself.

Printed: per scenario, the false incidents against the target (issue 27: 0), the runs that
passed, and the training time p50 (worst) against the job's without the phase. Needs root
(the local cluster runs as root).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

TARGET_FALSE_INCIDENTS = 0
SCENARIOS = ("guard-slow-save", "guard-long-eval", "guard-pause", "guard-slow-compile")


def one_run(scenario: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``scenario`` (a shipped name or a file) into ``out``; what it did."""
    cmd = [sys.executable, "-m", "recover", "scenario", "run", scenario, "--out", str(out),
           "--json", "--no-budgets", "--slurm", args.slurm, "--mode", args.mode]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    result = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    row: dict[str, Any] = {"passed": bool(result.get("passed"))}
    try:
        incidents = json.loads((out / "incidents.json").read_text())
        row["incidents"] = [f"{i.get('fault')} on {i.get('node')}" for i in incidents]
        row["training_s"] = _training_seconds(out / "events.jsonl")
    except (OSError, ValueError, KeyError) as e:
        row["error"] = f"{type(e).__name__}: {e}; " + done.stderr[-500:]
    if not row["passed"]:
        row["failed"] = [c["detail"] for c in result.get("checks", []) if c["ok"] is False]
    return row


def _training_seconds(events: Path) -> float:
    """Process 0's first ``warmup`` to its last ``completed`` event, in seconds."""
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    start = next(e["ts"] for e in lines if e["event"] == "warmup")
    end = [e["ts"] for e in lines if e["event"] == "completed"][-1]
    return float(end - start)


def without_long_phases(name: str, base: Path) -> tuple[str, Path]:
    """The shipped scenario ``name``'s job without its long phase, as a scenario file in
    ``base``; returns (a key naming the job, the file). Jobs alike share one key."""
    from scenarios.loader import find

    loaded = find(name)
    doc = yaml.safe_load(loaded.text)
    doc["job"].pop("long_phases")
    key = json.dumps(doc["job"], sort_keys=True)
    doc["name"] = "baseline-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    doc["description"] = "a guard scenario's job without its long phase"
    path = base / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return key, path


def _p50_worst(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):6.1f} s ({max(values):6.1f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline-runs", type=int, default=2)
    parser.add_argument("--slurm", default="auto", choices=("auto", "25.11", "22.05"))
    parser.add_argument("--mode", default="requeue", choices=("requeue", "in-allocation"))
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = args.scenario or list(SCENARIOS)
    base = args.out or Path(tempfile.mkdtemp(prefix="guard-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    made = {name: without_long_phases(name, base) for name in names}
    baselines = dict(made.values())  # one per distinct job
    job_of = {name: key for name, (key, _) in made.items()}
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        print(f"  {json.dumps(row)}", file=sys.stderr, flush=True)

    for i in range(args.baseline_runs):
        for key, path in baselines.items():
            out = base / f"{path.stem}-{i}"
            record({"baseline": key, "run": i} | one_run(str(path), out, args))
    for i in range(args.runs):
        for name in names:
            record({"scenario": name, "run": i} | one_run(name, base / f"{name}-{i}", args))
    print(f"guard scenarios: false incidents and what the long phase cost, Slurm {args.slurm}, "
          f"{args.mode} path, {args.runs} run(s) each, {args.baseline_runs} of each job "
          f"without its long phase (runs in {base})")  # fmt: skip
    print(f"{'scenario':<20} {'false incidents':>15} {'target':>6} {'passed':>7} "
          f"{'training p50 (worst)':>22} {'without the phase':>22} {'cost p50':>9}")  # fmt: skip
    for name in names:
        mine = [r for r in rows if r.get("scenario") == name]
        plain = [
            r["training_s"] for r in rows if r.get("baseline") == job_of[name] and "training_s" in r
        ]
        walls = [r["training_s"] for r in mine if "training_s" in r]
        false = sum(len(r.get("incidents", [])) for r in mine)
        cost = (
            f"{statistics.median(walls) - statistics.median(plain):6.1f} s"
            if walls and plain
            else "-"
        )
        print(f"{name:<20} {false:>15} {TARGET_FALSE_INCIDENTS:>6} "
              f"{sum(r['passed'] for r in mine):>3}/{len(mine):<3} {_p50_worst(walls):>22} "
              f"{_p50_worst(plain):>22} {cost:>9}")  # fmt: skip
        for r in mine:
            if r.get("incidents") or r.get("error") or r.get("failed"):
                print(f"    run {r['run']}: {r.get('incidents') or ''} {r.get('error') or ''} "
                      f"{r.get('failed') or ''}".rstrip())  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "target": TARGET_FALSE_INCIDENTS},
                                        indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
