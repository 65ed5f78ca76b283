"""Decisions at scale: how fast the coordinator decides and acts on an event storm.

Run (see ``benchmarks/README.md``)::

    .venv/bin/python -m benchmarks.decision_bench [--nodes 10000] [--storms 150,1000]
        [--read-ms 30] [--update-ms 20] [--spares 100] [--job-nodes 8] [--spread-s 1]
        [--deadline-s 25] [--policies raised,default] [--http] [--dir DIR] [--json out.json]

Each run is a fresh coordinator: the real :class:`Engine` and :class:`Rules` on its worker
thread, a real :class:`SqliteJournal` (WAL, ``synchronous=FULL``) in a temporary directory,
and a :class:`FakeSlurm` of ``--nodes`` nodes (``--spares`` of them in the spare pool, the
rest running jobs of ``--job-nodes`` nodes each) whose every call sleeps as a slurmctld
round trip would: ``--read-ms`` for a read of all nodes or all jobs, ``--update-ms`` for an
``scontrol update``. A storm of N distinct nodes failing with XID 79 within ``--spread-s`` is
then appended to the journal the way the intake does it (``append_events`` in small groups,
stamped on receipt, then ``submit`` to wake the worker) from a thread of this process, as the
HTTP intake's commit thread would. With ``--http`` the coordinator runs in a server process
behind the real HTTP intake instead, and this process POSTs one request per failed node with
that node's token (:mod:`benchmarks.decision_http`).

Two policies: ``raised`` lifts the breaker's limits so every node is taken out; ``default`` is
the shipped policy, whose breaker takes out 10 nodes and holds the rest. Per event, from the
journal: receipt -> decision recorded, receipt -> take-down recorded done (what NVSentinel
calls quarantine), and for the default policy receipt -> hold recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.decision_rig import POLICIES, Options, Result, run_one

#: NVSentinel's published quarantine latency for 150 failed nodes, in seconds.
REFERENCE = {"nodes": 150, "p50_s": 16.75, "p99_s": 31.35}
#: At least this many times faster than the reference, at p50 and p99.
TARGET_SPEEDUP = 10.0
#: p99 from receipt to decision recorded, in seconds, at 10,000 nodes.
TARGET_DECISION_P99_S = 1.0


def run(opts: Options, workdir: Path) -> list[Result]:
    """Every storm under every policy, in order, each on a fresh coordinator."""
    one = run_one
    if opts.http:
        from benchmarks.decision_http import run_one_http  # starts server processes

        one = run_one_http
    return [one(opts, size, p, workdir) for size in opts.storms for p in opts.policies]


# --- report ---------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _row(r: Result, what: str, s: dict[str, Any], total: float | None) -> str:
    return (
        f"{r.storm:>5} {r.policy:<8} {what:<18} {s['count']:>5} {_ms(s['p50_s']):>8} "
        f"{_ms(s['p99_s']):>8} {_ms(s['max_s']):>8} {_ms(total):>9}"
    )


def targets(results: Sequence[Result]) -> list[tuple[str, bool, str]]:
    """``(target, met, measured)`` for each target the results speak to."""
    out = []
    for r in results:
        label = f"storm {r.storm}, {r.policy}"
        p99 = r.decision["p99_s"]
        complete = r.finished and r.decided == r.storm
        out.append(
            (
                f"{label}: p99 receipt->decision < {TARGET_DECISION_P99_S:g} s, all decided",
                complete and p99 is not None and p99 < TARGET_DECISION_P99_S,
                f"{_ms(p99)} ms, {r.decided}/{r.storm} decided",
            )
        )
        if r.policy != "raised":
            continue
        for q in ("p50", "p99"):
            ours = r.takedown[f"{q}_s"]
            speedup = REFERENCE[f"{q}_s"] / ours if ours else 0.0
            out.append(
                (
                    f"{label}: take-down {q} >= {TARGET_SPEEDUP:g}x faster than NVSentinel's "
                    f"{REFERENCE[f'{q}_s']:g} s",
                    complete and r.takedown["count"] == r.storm and speedup >= TARGET_SPEEDUP,
                    f"{_ms(ours)} ms = {speedup:.1f}x, {r.takedown['count']}/{r.storm} taken down",
                )
            )
    return out


def report(results: Sequence[Result], opts: Options) -> str:
    """The table, the reference and the targets, as text."""
    lines = [
        f"{opts.nodes} nodes ({opts.spares} spares, jobs of {opts.job_nodes} nodes), Slurm "
        f"read {opts.read_s * 1000:g} ms, update {opts.update_s * 1000:g} ms; each storm "
        + (
            f"POSTed over {opts.spread_s:g} s to the HTTP intake, one request per node"
            if opts.http
            else f"appended over {opts.spread_s:g} s in groups, {opts.groups_per_s} commits/s"
        ),
        "latency from the event's receipt (ms); total = first receipt -> last of them",
        f"{'storm':>5} {'policy':<8} {'measure':<18} {'count':>5} {'p50':>8} {'p99':>8} "
        f"{'max':>8} {'total':>9}",
        "-" * 76,
    ]
    for r in results:
        lines.append(_row(r, "decision recorded", r.decision, r.all_decided_s))
        lines.append(_row(r, "take-down done", r.takedown, r.all_done_s))
        if r.held["count"]:
            lines.append(_row(r, "hold recorded", r.held, None))
        if r.intake is not None:
            lines.append(_row(r, "POST answered", r.intake, None))
        if r.from_send is not None:
            lines.append(_row(r, "sent->decision", r.from_send["decision"], None))
            lines.append(_row(r, "sent->take-down", r.from_send["takedown"], None))
        cpu = (
            f"; CPU during the POSTs: server {r.intake['server_cpu_s']:.1f} s, "
            f"load {r.intake['load_cpu_s']:.1f} s"
            if r.intake
            else ""
        )
        rate = r.takedown["count"] / r.all_done_s if r.all_done_s else 0.0
        lines.append(
            f"{'':>14} {'finished' if r.finished else 'NOT FINISHED by the deadline'}; "
            f"{r.decided}/{r.storm} decided, {r.promoted} spares promoted, "
            f"{rate:.0f} take-downs/s; Slurm {r.slurm_updates} updates, {r.slurm_reads} reads; "
            f"run {r.wall_s:.1f} s{cpu}"
        )
    lines += [
        "",
        f"reference: NVSentinel quarantine of {REFERENCE['nodes']} failed nodes: "
        f"p50 {REFERENCE['p50_s']:g} s, p99 {REFERENCE['p99_s']:g} s (about 1 node/s)",
        "targets:",
    ]
    lines += [f"  [{'met' if ok else 'MISSED'}] {t}: {got}" for t, ok, got in targets(results)]
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    for n in names:
        if n not in POLICIES:
            raise argparse.ArgumentTypeError(f"unknown policy {n!r}; known: {', '.join(POLICIES)}")
    return names


def parse(argv: Sequence[str] | None) -> tuple[Options, argparse.Namespace]:
    d = Options()
    p = argparse.ArgumentParser(prog="python -m benchmarks.decision_bench", description=__doc__)
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--storms", type=_ints, default=d.storms, help="nodes failing, per storm")
    p.add_argument("--policies", type=_policies, default=d.policies, help="raised,default")
    p.add_argument("--read-ms", type=float, default=d.read_s * 1000)
    p.add_argument("--update-ms", type=float, default=d.update_s * 1000)
    p.add_argument("--spares", type=int, default=d.spares)
    p.add_argument("--job-nodes", type=int, default=d.job_nodes)
    p.add_argument("--spread-s", type=float, default=d.spread_s)
    p.add_argument("--groups-per-s", type=int, default=d.groups_per_s)
    p.add_argument("--deadline-s", type=float, default=d.deadline_s, help="per run, to settle")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--http", action="store_true", help="through the HTTP intake (a server process)")
    p.add_argument("--dir", type=Path, default=None, help="where the journals go ($TMPDIR)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if max(a.storms, default=0) > a.nodes - a.spares:
        p.error(f"a storm of {max(a.storms)} needs that many in-service nodes")
    opts = Options(
        nodes=a.nodes,
        storms=a.storms,
        policies=a.policies,
        read_s=a.read_ms / 1000,
        update_s=a.update_ms / 1000,
        spares=a.spares,
        job_nodes=a.job_nodes,
        spread_s=a.spread_s,
        groups_per_s=a.groups_per_s,
        deadline_s=a.deadline_s,
        seed=a.seed,
        http=a.http,
    )
    return opts, a


def main(argv: Sequence[str] | None = None) -> int:
    opts, args = parse(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="decision-bench-") as tmp:
        results = run(opts, Path(tmp))
    print(report(results, opts))
    if args.json is not None:
        out = {
            "options": asdict(opts),
            "reference": REFERENCE,
            "results": [asdict(r) for r in results],
            "targets": [{"target": t, "met": ok, "measured": g} for t, ok, g in targets(results)],
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(r.finished for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
