"""Recovery inside the allocation against a requeue, on the same fault, side by side.

    .venv/bin/python -m benchmarks.inalloc_bench [--runs 3] [--steps 24] [--save-every 5]
        [--fault-step 8] [--mode both|in-allocation|requeue] [--json out.json]

One local Slurm cluster (3 nodes, Debian's 22.05 unless RECOVER_SLURM says otherwise, 11 s
requeue wait) serves every run. Each run submits `recover sbatch -N 2` of a real 2-process
JAX job (mlp-tiny, 0.3 s a step): with ``--spares 1`` (in-allocation: the job holds the third
node) or without (requeue). When process 1 reaches ``--fault-step`` it is killed with
SIGABRT (no save, as on XID 79) and its node is set DOWN at once (what the coordinator does
on that verdict; the coordinator itself is not in the loop, so detection is not measured).
Then:

* in-allocation: Slurm drops the node from the ``--no-kill`` job, the step ends, the job's
  supervisor relaunches training on the spare (the batch host);
* requeue: Slurm requeues the job (``--requeue``), which starts again on the two nodes left
  after ``cred_expire``.

Measured per run, from the job's own events: **fault -> processes joined again** (the
SIGABRT to process 0 of the new launch joining its group: the relaunch or the requeue wait,
plus process start-up), **fault -> training again** (to the first training step of the new
launch, seconds: adds JAX start-up, restore and compilation) and **steps recomputed** (the
newest step reached before the fault minus the checkpoint step restored). The job must
complete with the same final digest in both modes (checked; a run that does not is reported
as failed). The DOWN node is resumed between runs. Needs root (the local cluster runs as
root). The printed load average says how busy the machine was: read times as ratios between
the modes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.events import read_rank_events
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from slurm.sbatch import submit_training

MODES = ("in-allocation", "requeue")
RECOVER = str(Path(sys.executable).parent / "recover")


@dataclass
class Series:
    mode: str
    recovery_s: list[float] = field(default_factory=list)
    joined_s: list[float] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    digests: set[str] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)


def _wait(probe: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _events(run: Path) -> dict[int, list[dict[str, Any]]]:
    return read_rank_events(run) if run.exists() else {}


def _of(run: Path, rank: int, name: str) -> list[dict[str, Any]]:
    return [e for e in _events(run).get(rank, []) if e["event"] == name]


def one_run(
    ctl: CliSlurm, work: Path, mode: str, i: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Submit, fault, wait for completion; the run's figures."""
    run = work / f"{mode}-{i}"
    train = ["--steps", str(args.steps), "--save-every", str(args.save_every),
             "--model", "mlp-tiny", "--step-sleep", "0.3"]  # fmt: skip
    job_id = submit_training(
        ctl,
        [RECOVER, "train", "--run-dir", str(run), *train],
        sbatch_args=["--nodes=2", f"--output={work}/{mode}-{i}-%j.out", f"--chdir={work}"],
        signal_lead_s=30,
        processes=2,
        spares=1 if mode == "in-allocation" else 0,
    )
    _wait(
        lambda: any(e["step"] >= args.fault_step for e in _of(run, 1, "step")),
        300,
        f"process 1 at step {args.fault_step}",
    )
    (joined,) = _of(run, 1, "joined")
    (joined0,) = _of(run, 0, "joined")
    victim = str(_of(run, 1, "started")[0]["node"])
    fault_at = time.time()
    os.kill(int(joined["pid"]), signal.SIGABRT)
    ctl.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=bench-xid79"])
    _wait(lambda: ctl.job(job_id).state == "COMPLETED", 600, f"job {job_id} to complete")
    before = [e["step"] for e in _of(run, 0, "step") if e["ts"] <= fault_at]
    after = [e for e in _of(run, 0, "step") if e["ts"] > fault_at and e["pid"] != joined0["pid"]]
    restored = [e for e in _of(run, 0, "restored") if e["ts"] > fault_at]
    rejoined = [e for e in _of(run, 0, "joined") if e["ts"] > fault_at]
    (done,) = _of(run, 0, "completed")
    ctl.resume(victim, force=True)
    _wait(lambda: not ctl.node(victim).down, 60, f"{victim} back")
    return {
        "recovery_s": after[0]["ts"] - fault_at,
        "joined_s": rejoined[0]["ts"] - fault_at,
        "recomputed": max(before) - int(restored[0]["checkpoint_step"]),
        "requeued": ctl.job(job_id).restart_count,
        "digest": done["state_digest"],
    }


def _p(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(series: list[Series]) -> str:
    rows = [
        "| mode | runs | fault -> processes joined again, s | fault -> training again, s "
        "| steps recomputed | requeues |",
        "|---|---|---|---|---|---|",
    ]
    for s in series:
        recomputed = [float(x) for x in s.recomputed]
        rows.append(
            f"| {s.mode} | {len(s.recovery_s)} ({len(s.failed)} failed) | {_p(s.joined_s)} "
            f"| {_p(s.recovery_s)} "
            f"| {_p(recomputed)} | {sum(s.requeued)} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--fault-step", type=int, default=8)
    parser.add_argument("--mode", choices=("both", *MODES), default="both")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 0 < args.fault_step < args.steps:
        parser.error(f"--fault-step {args.fault_step}: expected 1 to {args.steps - 1}")
    modes = MODES if args.mode == "both" else (args.mode,)
    load_before = os.getloadavg()
    series = [Series(m) for m in modes]
    # Short path: slurmstepd's socket paths must stay under 108 characters.
    with tempfile.TemporaryDirectory(prefix="iab-") as tmp:
        cluster = LocalCluster(Path(tmp) / "c", slurmd_timeout_s=6)
        cluster.up(nodes=3, spares=0)
        try:
            ctl = cluster.control()
            work = Path(tmp) / "w"
            work.mkdir()
            for i in range(args.runs):
                for s in series:  # interleaved, so both modes see the same load
                    try:
                        got = one_run(ctl, work, s.mode, i, args)
                    except (TimeoutError, ValueError, IndexError, KeyError) as e:
                        s.failed.append(f"run {i}: {e}")
                        ctl.run(["scancel", "--user=root"])
                        for n in ctl.nodes():
                            if n.down:
                                ctl.resume(n.name, force=True)
                        continue
                    s.recovery_s.append(got["recovery_s"])
                    s.joined_s.append(got["joined_s"])
                    s.recomputed.append(got["recomputed"])
                    s.requeued.append(got["requeued"])
                    s.digests.add(got["digest"])
                    print(f"{s.mode} run {i}: {json.dumps(got)}", flush=True)
        finally:
            cluster.down()
    load_after = os.getloadavg()
    print()
    print(table(series))
    digests = set().union(*(s.digests for s in series))
    print(f"\nfinal digests: {sorted(digests)} ({'equal' if len(digests) == 1 else 'DIFFER'})")
    print(f"load average (1/5/15 min) before {load_before}, after {load_after}")
    if len(series) == 2 and series[0].recovery_s and series[1].recovery_s:
        ia, rq = (statistics.median(s.recovery_s) for s in series)
        print(f"in-allocation / requeue, fault -> training again (p50): {ia / rq:.2f}")
    if args.json:
        args.json.write_text(json.dumps([s.__dict__ | {"digests": sorted(s.digests)}
                                         for s in series], indent=2))  # fmt: skip
    failed = any(s.failed for s in series) or len(digests) > 1
    for s in series:
        for f in s.failed:
            print(f"{s.mode}: FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
