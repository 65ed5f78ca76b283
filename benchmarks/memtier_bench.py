"""What the memory tier costs the training loop: steps per second with a node-local copy
every step (``--memory-every 1``) against none, the same K-process job side by side.

    .venv/bin/python -m benchmarks.memtier_bench [--runs 3] [--processes 2] [--steps 300]
        [--model mlp-tiny] [--every 1] [--budget 0.025] [--json out.json]

Each run starts K real ``recover train`` processes on this machine (joined as under srun,
each told its own node name), trains ``--steps`` steps with no durable checkpoint but the
final one, and takes process 0's wall time per step (its ``step`` events, the steady state:
the first 10 steps are left out; the mean, since copies the tier's budget spaces out would
vanish from a median). The modes alternate run by run so that both see the same load.
Printed: the median over runs of each mode's time per step, and their ratio against the
target (the tier costs at most 5% of step time: ratio <= 1.05).
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

from recovery.events import read_rank_events
from recovery.multiproc import free_port

TARGET = 1.05
WARM = 10


def one_run(work: Path, every: int, args: argparse.Namespace, i: int) -> tuple[float, int]:
    """Process 0's wall time per step (seconds) in one K-process run, and the copies it made."""
    run_dir = work / f"every{every}-{i}"
    port = free_port()
    procs = []
    for rank in range(args.processes):
        env = {
            **os.environ,
            "RECOVER_NUM_PROCESSES": str(args.processes),
            "RECOVER_PROCESS_ID": str(rank),
            "RECOVER_RENDEZVOUS": f"127.0.0.1:{port}",
            "RECOVER_MEMORY_EVERY": str(every),
            "RECOVER_MEMORY_BUDGET": str(args.budget),
            "RECOVER_MEMORY_DIR": str(work / "shm"),
            "SLURMD_NODENAME": f"bench{rank}",
        }
        cmd = [sys.executable, "-m", "recover", "train", "--run-dir", str(run_dir),
               "--steps", str(args.steps), "--save-every", str(args.steps),
               "--model", args.model, "--compile-cache", str(work / "cache")]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=1200)
        if p.returncode:
            raise RuntimeError(f"a process ended {p.returncode}: {err.decode()[-2000:]}")
    events = read_rank_events(run_dir)[0]
    copies = int(next(e for e in events if e["event"] == "completed").get("memory_copies", 0))
    ts = [e["ts"] for e in events if e["event"] == "step"][WARM:]
    # Wall time per step over the steady state (the mean, not the median: copies made every
    # few tens of steps would vanish from a median).
    return float((ts[-1] - ts[0]) / (len(ts) - 1)), copies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="mlp-tiny")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--budget", type=float, default=0.025,
                        help="recover train --memory-budget")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps <= WARM + 2:
        parser.error(f"--steps must be over {WARM + 2}")
    load_before = os.getloadavg()
    got: dict[int, list[float]] = {0: [], args.every: []}
    with tempfile.TemporaryDirectory(prefix="memtier-") as tmp:
        work = Path(tmp)
        one_run(work, 0, args, -1)  # fills the compilation cache: not measured
        for i in range(args.runs):
            for every in got:
                per_step, copies = one_run(work, every, args, i)
                got[every].append(per_step)
                print(f"run {i}, memory every {every}: {per_step * 1e3:.2f} ms/step, "
                      f"{copies} copies in {args.steps} steps", flush=True)  # fmt: skip
    off, on = (statistics.median(v) for v in got.values())
    ratio = on / off
    print()
    print(f"| {args.model}, {args.processes} processes | time per step (median of runs) | runs |")
    print("|---|---|---|")
    print(f"| no memory tier | {off * 1e3:.2f} ms | {len(got[0])} |")
    print(f"| a copy every {args.every} step(s) | {on * 1e3:.2f} ms | {len(got[args.every])} |")
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"\nwith / without: {ratio:.3f} (target <= {TARGET}: {verdict})")
    print(f"load average (1/5/15 min) before {load_before}, after {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"off_s": got[0], "on_s": got[args.every],
                                         "ratio": ratio}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
