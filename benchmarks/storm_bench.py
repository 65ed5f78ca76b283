"""A storm on real daemons: many nodes fail at once on a real slurmctld; how soon is each DOWN?

Run as root (see ``benchmarks/README.md``)::

    .venv/bin/python -m benchmarks.storm_bench [--nodes 256] [--spares 8] [--faulted 150]
        [--agents 4] [--backend cli [--backend rest ...]] [--slurm auto|25.11|22.05]
        [--runs 1] [--no-jobs] [--no-fake] [--seed 1] [--deadline-s 60] [--dir DIR]
        [--json out.json]

Each run starts, under a fresh temporary folder (``--dir``, default ``/tmp``): a local Slurm
cluster of ``--nodes`` real slurmd plus ``--spares`` spares (:class:`slurm.cluster.LocalCluster`)
with one single-node job running on every compute node; the real coordinator, started the way
``recover cluster up --coordinator`` starts it, its breaker lifted above the storm; and a real
agent on ``--agents`` of the nodes about to fail. Then ``--faulted`` nodes (chosen with
``--seed``) fail with XID 79 at one instant: a kernel line is written into the kernel log each
agent follows, and every other node's event is POSTed to the coordinator's intake with that
node's own token, as its agent would send it.

``--slurm`` picks the cluster's Slurm as ``recover cluster up --slurm`` does (without it,
Debian's 22.05, as every storm measured before the option); ``--backend``
given more than once runs the storms with each backend in turn (each on fresh clusters) and
ends with a table of them side by side. Each run reports the cluster's start-up and what its
processes (slurmctld, every slurmd, munged and the jobs) hold in memory.

Measured per faulted node: fault -> DOWN, where DOWN is the stamp of slurmctld's own log line
(``update_node: node X state set to DOWN``); beside it the coordinator's receipt -> take-down
recorded, the same storm on ``decision_bench``'s fake Slurm (``--no-fake`` skips it), and
NVSentinel's published quarantine latency for 150 nodes. Checked: every faulted node is DOWN
with our reason, and no healthy node changed (state, reason, running job, named in no update).
Everything is stopped by pid at the end, and the run fails if anything is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.decision_bench import REFERENCE
from benchmarks.decision_rig import Options as FakeOptions
from benchmarks.decision_rig import Result as FakeResult
from benchmarks.decision_rig import run_one as run_fake
from benchmarks.storm_read import STAGES, nodes_of_update, summary
from benchmarks.storm_rig import Rig, StormOptions, StormResult
from recovery.errors import RecoverError
from service import wiring


def fake_storm(opts: StormOptions, workdir: Path) -> FakeResult:
    """The same storm on ``decision_bench``'s timed fake Slurm (its default round trips), the
    breaker lifted, the events committed within 0.1 s."""
    fake = FakeOptions(
        nodes=opts.nodes + opts.spares,
        spares=opts.spares,
        storms=(opts.faulted,),
        policies=("raised",),
        job_nodes=1,
        spread_s=0.1,
        seed=opts.seed,
    )
    return run_fake(fake, opts.faulted, "raised", workdir)


# --- report ----------------------------------------------------------------------------------


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ratio(ref: float, ours: float | None) -> str:
    return "-" if not ours else f"{ref / ours:.1f}x"


def _row(what: str, s: dict[str, Any], vs_reference: bool = False) -> str:
    ratios = ""
    if vs_reference:
        ratios = (f"{_ratio(REFERENCE['p50_s'], s['p50_s']):>8} "
                  f"{_ratio(REFERENCE['p99_s'], s['p99_s']):>8}")  # fmt: skip
    return (f"{what:<52} {s['count']:>5} {_s(s['p50_s']):>7} {_s(s['p99_s']):>7} "
            f"{_s(s['max_s']):>7} {ratios}").rstrip()  # fmt: skip


def _updates(calls: list[str] | None) -> str:
    if calls is None:
        return (
            "updates: not counted (the coordinator's scontrol calls are logged for the "
            "cli backend on Debian's Slurm only)"
        )
    downs = [c for c in calls if "state=down" in c.lower()]
    resumes = [c for c in calls if "state=resume" in c.lower()]
    sizes = ", ".join(str(len(nodes_of_update(c))) for c in downs)
    return (f"scontrol updates by the coordinator: {len(calls)} ({len(downs)} DOWN of "
            f"[{sizes}] nodes, {len(resumes)} RESUME of a spare)")  # fmt: skip


def report(
    opts: StormOptions,
    runs: Sequence[StormResult],
    fake: FakeResult | None,
    leftovers: Sequence[str],
) -> str:
    """The table (seconds, and how many times faster than NVSentinel) and the checks."""
    posted = opts.faulted - opts.agents
    lines = [
        f"storm on real daemons: {opts.nodes} slurmd + {opts.spares} spares"
        f"{', one job each' if opts.jobs else ''}; {opts.faulted} faulted at once "
        f"({opts.agents} through real agents reading a kernel line, {posted} POSTed with "
        f"their own tokens); backend {opts.backend}; {runs[0].slurm}; {os.cpu_count()} cores",
        "",
        f"{'measure (seconds)':<52} {'count':>5} {'p50':>7} {'p99':>7} {'max':>7} "
        f"{'vs NVSentinel p50, p99':>18}",
        "-" * 106,
    ]
    for k, r in enumerate(runs, 1):
        tag = f"run {k}" if len(runs) > 1 else "real"
        lines.append(_row(f"{tag}: fault -> DOWN in slurmctld's log", r.fault_to_down, True))
        lines.append(_row(f"{tag}: receipt -> take-down recorded", r.receipt_to_takedown))
        lines.append(_row(f"{tag}: fault -> POST answered", r.post_answered))
        lines += [_row(f"  {name}", r.stages[name]) for name in STAGES]
        lines.append(_row(f"{tag}: fault -> spare promoted (recorded)", r.promoted))
    if fake is not None:
        lines.append(_row("decision_bench (fake Slurm): receipt -> take-down", fake.takedown,
                          True))  # fmt: skip
    ref = {"count": REFERENCE["nodes"], "p50_s": REFERENCE["p50_s"],
           "p99_s": REFERENCE["p99_s"], "max_s": None}  # fmt: skip
    lines += [_row("NVSentinel (published): fault -> quarantined", ref), ""]
    for k, r in enumerate(runs, 1):
        tag = f"run {k}: " if len(runs) > 1 else ""
        healthy = opts.nodes - opts.faulted
        lines += [
            f"{tag}load average as the storm began {r.load[0]:g} / {r.load[1]:g} / {r.load[2]:g}; "
            f"cluster up in {r.up_s:.1f} s, jobs running after {r.jobs_s:.1f} s; its "
            f"processes held {r.memory_mb:.0f} MiB",
            f"{tag}{_updates(r.updates)}",
            f"{tag}{len(r.faulted) - len(r.not_down)}/{len(r.faulted)} faulted nodes DOWN"
            + (f" (never: {', '.join(r.not_down)})" if r.not_down else "")
            + f"; {healthy} healthy nodes: "
            + ("none changed" if not r.problems else f"{len(r.problems)} problems:"),
            *(f"  {p}" for p in r.problems),
        ]
    if fake is not None:
        lines.append(
            f"decision_bench: {fake.slurm_updates} updates, {fake.slurm_reads} reads of its "
            "fake Slurm (30 ms a read, 20 ms an update)"
        )
    lines.append("left running afterwards: " + (", ".join(leftovers) if leftovers else "nothing"))
    return "\n".join(lines)


def side_by_side(by_backend: dict[str, list[StormResult]]) -> str:
    """Fault -> DOWN of every run of each backend, one row each, beside NVSentinel's."""
    lines = [
        "side by side: fault -> DOWN in slurmctld's log, every faulted node of every run",
        f"{'backend':<12} {'runs':>4} {'nodes':>6} {'p50':>7} {'p99':>7} {'max':>7} "
        f"{'vs NVSentinel p50, p99':>22} {'up (s)':>7} {'MiB':>7}",
    ]
    for backend, runs in by_backend.items():
        if not runs:
            lines.append(f"{backend:<12} {0:>4}  (did not run)")
            continue
        s = summary(v for r in runs for v in r.down_s)
        lines.append(
            f"{backend:<12} {len(runs):>4} {s['count']:>6} {_s(s['p50_s']):>7} "
            f"{_s(s['p99_s']):>7} {_s(s['max_s']):>7} "
            f"{_ratio(REFERENCE['p50_s'], s['p50_s']):>11} "
            f"{_ratio(REFERENCE['p99_s'], s['p99_s']):>10} "
            f"{max(r.up_s for r in runs):>7.1f} {max(r.memory_mb for r in runs):>7.0f}"
        )
    return "\n".join(lines)


# --- command ---------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> tuple[StormOptions, argparse.Namespace]:
    d = StormOptions()
    p = argparse.ArgumentParser(prog="python -m benchmarks.storm_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--nodes", type=int, default=d.nodes, help="compute nodes (real slurmd)")
    p.add_argument("--spares", type=int, default=d.spares)
    p.add_argument("--faulted", type=int, default=d.faulted, help="nodes failing at once")
    p.add_argument("--agents", type=int, default=d.agents,
                   help="of the faulted nodes, how many report through a real agent")  # fmt: skip
    p.add_argument("--backend", action="append", choices=wiring.SLURM_BACKENDS,
                   help="how the coordinator reaches Slurm; more than once: each in turn, "
                        f"side by side [default: {d.backend}]")  # fmt: skip
    p.add_argument(
        "--slurm",
        default=None,
        help="the cluster's Slurm: auto, 25.11 or 22.05 [default: Debian's 22.05]",
    )
    p.add_argument("--runs", type=int, default=1, help="storms, each on a fresh cluster")
    p.add_argument("--no-jobs", action="store_true", help="idle nodes instead of a job each")
    p.add_argument("--no-fake", action="store_true", help="skip decision_bench's fake Slurm")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--deadline-s", type=float, default=d.deadline_s,
                   help="from the storm to every faulted node DOWN")  # fmt: skip
    p.add_argument("--dir", type=Path, default=Path("/tmp"),
                   help="where the temporary cluster goes (a short path)")  # fmt: skip
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    a.backend = list(dict.fromkeys(a.backend or [d.backend]))
    opts = StormOptions(nodes=a.nodes, spares=a.spares, faulted=a.faulted, agents=a.agents,
                        backend=a.backend[0], slurm=a.slurm, jobs=not a.no_jobs, seed=a.seed,
                        deadline_s=a.deadline_s)  # fmt: skip
    try:
        opts.check()
        from slurm.install import choose

        if a.slurm is not None:
            choose(a.slurm)
    except RecoverError as e:
        p.error(str(e))
    if a.runs < 1:
        p.error(f"Invalid --runs {a.runs}: expected 1 or more")
    return opts, a


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    opts, args = parse(argv)
    if os.geteuid() != 0:
        _say("storm_bench: run as root (munged runs as user munge, slurmd runs jobs)")
        return 2
    by_backend: dict[str, list[StormResult]] = {}
    leftovers: list[str] = []
    failed = False
    for backend in args.backend:
        mine = replace(opts, backend=backend)
        runs = by_backend.setdefault(backend, [])
        for k in range(args.runs):
            root = Path(tempfile.mkdtemp(prefix="storm-", dir=args.dir))
            rig = Rig(mine, root, log=_say)
            try:
                with rig:
                    rig.start()
                    _say(f"{backend} run {k + 1}: the storm")
                    runs.append(rig.storm())
            except (RecoverError, TimeoutError) as e:
                _say(f"storm_bench: {backend}: {e}")
                failed = True
                break
            finally:
                leftovers += rig.leftovers
                if leftovers:
                    _say(f"storm_bench: left running: {', '.join(leftovers)}")
                shutil.rmtree(root, ignore_errors=True)
    fake = None
    if not args.no_fake:
        _say("decision_bench's fake Slurm: the same storm")
        with tempfile.TemporaryDirectory(prefix="storm-fake-", dir=args.dir) as tmp:
            fake = fake_storm(opts, Path(tmp))
    for backend, runs in by_backend.items():
        if runs:
            print(report(replace(opts, backend=backend), runs, fake, leftovers) + "\n")
    if len(by_backend) > 1:
        print(side_by_side(by_backend))
    if args.json is not None:
        doc = {
            "options": asdict(opts),
            "backends": args.backend,
            "reference": REFERENCE,
            "runs": [asdict(r) for runs in by_backend.values() for r in runs],
            "decision_bench": None if fake is None else asdict(fake),
            "leftovers": leftovers,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    every = [r for runs in by_backend.values() for r in runs]
    ok = not failed and all(not r.problems and not r.not_down for r in every) and not leftovers
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
