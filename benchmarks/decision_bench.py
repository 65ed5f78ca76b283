"""Decisions at scale: how fast the coordinator decides and acts on an event storm.

Run (see ``benchmarks/README.md``)::

    .venv/bin/python -m benchmarks.decision_bench [--nodes 10000] [--storms 150,1000]
        [--read-ms 30] [--update-ms 20] [--spares 100] [--job-nodes 8] [--spread-s 1]
        [--deadline-s 25] [--policies raised,default] [--dir DIR] [--json out.json]

Each run is a fresh coordinator: the real :class:`Engine` and :class:`Rules` on its worker
thread, a real :class:`SqliteJournal` (WAL, ``synchronous=FULL``) in a temporary directory,
and a :class:`FakeSlurm` of ``--nodes`` nodes (``--spares`` of them in the spare pool, the
rest running jobs of ``--job-nodes`` nodes each) whose every call sleeps as a slurmctld
round trip would: ``--read-ms`` for a read of all nodes or all jobs, ``--update-ms`` for an
``scontrol update``. A storm of N distinct nodes failing with XID 79 within ``--spread-s`` is
then appended to the journal the way the intake does it (``append_events`` in small groups,
stamped on receipt, then ``submit`` to wake the worker) from a thread of this process, as the
HTTP intake's commit thread would; the HTTP layer itself is measured by ``intake_bench``.

Two policies: ``raised`` lifts the breaker's limits so every node is taken out; ``default`` is
the shipped policy, whose breaker takes out 10 nodes and holds the rest. Per event, from the
journal: receipt -> decision recorded, receipt -> take-down recorded done (what NVSentinel
calls quarantine), and for the default policy receipt -> hold recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recovery.coordinator.engine import Engine
from recovery.coordinator.rules import Rules
from recovery.coordinator.views import LAYOUT_KEY
from recovery.model import HealthEvent, Source, TakeDown
from recovery.policy import BreakerConfig, PolicyConfig, load_catalogue
from recovery.ports.clock import Clock, SystemClock
from recovery.ports.journal import ActionStatus, IncidentRecord, Journal
from recovery.service.journal import SqliteJournal
from tests.fakes.slurm import FakeSlurm

#: NVSentinel's published quarantine latency for 150 failed nodes, in seconds.
REFERENCE = {"nodes": 150, "p50_s": 16.75, "p99_s": 31.35}
#: At least this many times faster than the reference, at p50 and p99.
TARGET_SPEEDUP = 10.0
#: p99 from receipt to decision recorded, in seconds, at 10,000 nodes.
TARGET_DECISION_P99_S = 1.0
MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
POLICIES = ("raised", "default")
CATALOGUE = load_catalogue()


@dataclass(frozen=True)
class Options:
    """What one benchmark run does. Times in seconds."""

    nodes: int = 10_000
    storms: tuple[int, ...] = (150, 1000)
    policies: tuple[str, ...] = POLICIES
    read_s: float = 0.030
    update_s: float = 0.020
    spares: int = 100
    job_nodes: int = 8
    spread_s: float = 1.0
    groups_per_s: int = 100
    deadline_s: float = 25.0
    seed: int = 1


class TimedSlurm(FakeSlurm):
    """FakeSlurm whose reads and updates take the time a real slurmctld round trip takes."""

    def __init__(self, nodes: Sequence[str], spares: Sequence[str], read_s: float, update_s: float):
        super().__init__(nodes, spares)
        self.read_s, self.update_s = read_s, update_s

    def _call(self, *what: str) -> None:
        time.sleep(self.read_s if what[0] in ("nodes", "jobs") else self.update_s)
        super()._call(*what)


def build_slurm(opts: Options) -> TimedSlurm:
    """The cluster: ``n00000``... in service running jobs, the last ``spares`` in the pool."""
    names = [f"n{i:05d}" for i in range(opts.nodes)]
    serving, spares = names[: opts.nodes - opts.spares], names[opts.nodes - opts.spares :]
    slurm = TimedSlurm(serving, spares, opts.read_s, opts.update_s)
    for start in range(0, len(serving), max(1, opts.job_nodes)):
        slurm.run_job(serving[start : start + opts.job_nodes])
    return slurm


def policy(name: str, storm: int) -> PolicyConfig:
    """``default``: the shipped policy; ``raised``: its breaker lifted above ``storm``."""
    if name == "default":
        return PolicyConfig.default()
    return PolicyConfig(breaker=BreakerConfig(max_nodes=storm + 1, max_fraction=1.0))


def storm(opts: Options, size: int, clock: Clock) -> list[HealthEvent]:
    """``size`` XID 79 events on distinct in-service nodes chosen with ``opts.seed``."""
    rng = random.Random(opts.seed)
    chosen = rng.sample(range(opts.nodes - opts.spares), size)
    now = clock.now().wall
    return [
        HealthEvent(
            id=f"storm-{size}-{i}",
            node=f"n{i:05d}",
            source=Source.nvml,
            fault="xid79",
            accelerator=i % 8,
            observed_at=now,
            message=MESSAGE,
        )
        for i in chosen
    ]


def inject(
    journal: Journal, engine: Engine, events: Sequence[HealthEvent], clock: Clock, opts: Options
) -> None:
    """Append ``events`` in groups spread evenly over ``opts.spread_s``, as the intake's
    group commit would, and wake the engine after each commit."""
    groups = max(1, min(len(events), round(opts.groups_per_s * opts.spread_s)))
    per = math.ceil(len(events) / groups)
    start = time.monotonic()
    for k, first in enumerate(range(0, len(events), per)):
        delay = start + k * opts.spread_s / groups - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # pacing the load, not waiting for a result
        chunk = events[first : first + per]
        journal.append_events(chunk, clock.now())
        engine.submit(chunk)


def settled(journal: Journal) -> bool:
    """Every event decided and no take-down left to apply (held ones stay held)."""
    if journal.undecided():
        return False
    return not any(isinstance(r.action, TakeDown) for r in journal.pending_actions())


def wait_until(done: Callable[[], bool], deadline: float, every_s: float = 0.1) -> bool:
    """Poll ``done`` until it holds or ``deadline`` (monotonic seconds) passes."""
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


@dataclass
class Latencies:
    """Seconds from receipt, per event, for one measure."""

    values: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | int | None]:
        v = sorted(self.values)
        if not v:
            return {"count": 0, "p50_s": None, "p99_s": None, "max_s": None}
        return {
            "count": len(v),
            "p50_s": statistics.median(v),
            "p99_s": v[min(len(v) - 1, math.ceil(0.99 * len(v)) - 1)],
            "max_s": v[-1],
        }


@dataclass
class Result:
    """One storm under one policy."""

    storm: int
    policy: str
    finished: bool
    decided: int
    decision: dict[str, Any]
    takedown: dict[str, Any]
    held: dict[str, Any]
    promoted: int
    all_decided_s: float | None
    all_done_s: float | None
    slurm_updates: int
    slurm_reads: int
    wall_s: float


def _phase(inc: IncidentRecord, name: str) -> float | None:
    return next((p.at.mono for p in inc.phases if p.name == name), None)


def measure(journal: Journal, storm_ids: set[str]) -> dict[str, Any]:
    """Per-event latencies of the storm, from the journal's incidents and their stamps."""
    decision, takedown, held = Latencies(), Latencies(), Latencies()
    first, last_decided, last_done, promoted = math.inf, 0.0, 0.0, 0
    for inc in journal.incidents():
        if not storm_ids.intersection(inc.event_ids):
            continue
        received, decided = _phase(inc, "received"), _phase(inc, "decided")
        if received is None or decided is None:
            continue
        first, last_decided = min(first, received), max(last_decided, decided)
        decision.values.append(decided - received)
        for rec in inc.actions:
            if rec.status == ActionStatus.held and isinstance(rec.action, TakeDown):
                held.values.append(decided - received)
            if rec.status == ActionStatus.done and rec.finished is not None:
                if isinstance(rec.action, TakeDown):
                    takedown.values.append(rec.finished.mono - received)
                    last_done = max(last_done, rec.finished.mono)
                elif rec.action.kind == "promote":
                    promoted += 1
    return {
        "decision": decision.summary(),
        "takedown": takedown.summary(),
        "held": held.summary(),
        "promoted": promoted,
        "all_decided_s": last_decided - first if decision.values else None,
        "all_done_s": last_done - first if takedown.values else None,
    }


def run_one(opts: Options, size: int, policy_name: str, workdir: Path) -> Result:
    """One storm of ``size`` nodes on a fresh coordinator under ``policy_name``."""
    clock = SystemClock()
    slurm = build_slurm(opts)
    journal = SqliteJournal(workdir / f"journal-{size}-{policy_name}.db", clock)
    engine = Engine(
        journal=journal, slurm=slurm, clock=clock, rules=Rules(policy(policy_name, size), CATALOGUE)
    )
    began = time.monotonic()
    engine.start()
    try:
        # The first step reads the cluster and records its layout: wait for it to be ready.
        wait_until(lambda: journal.get_meta(LAYOUT_KEY) is not None, began + opts.deadline_s)
        events = storm(opts, size, clock)
        inject(journal, engine, events, clock, opts)
        finished = wait_until(lambda: settled(journal), time.monotonic() + opts.deadline_s)
    finally:
        engine.stop(timeout_s=opts.deadline_s)
    m = measure(journal, {e.id for e in events})
    journal.close()
    reads = sum(1 for c in slurm.calls if c[0] in ("nodes", "jobs"))
    return Result(
        storm=size,
        policy=policy_name,
        finished=finished,
        decided=int(m["decision"]["count"]),
        slurm_updates=len(slurm.updates()),
        slurm_reads=reads,
        wall_s=time.monotonic() - began,
        **{k: m[k] for k in ("decision", "takedown", "held", "promoted")},
        all_decided_s=m["all_decided_s"],
        all_done_s=m["all_done_s"],
    )


def run(opts: Options, workdir: Path) -> list[Result]:
    """Every storm under every policy, in order, each on a fresh coordinator."""
    return [run_one(opts, size, p, workdir) for size in opts.storms for p in opts.policies]


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
        f"appended over {opts.spread_s:g} s in groups, {opts.groups_per_s} commits/s",
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
        rate = r.takedown["count"] / r.all_done_s if r.all_done_s else 0.0
        lines.append(
            f"{'':>14} {'finished' if r.finished else 'NOT FINISHED by the deadline'}; "
            f"{r.decided}/{r.storm} decided, {r.promoted} spares promoted, "
            f"{rate:.0f} take-downs/s; Slurm {r.slurm_updates} updates, {r.slurm_reads} reads; "
            f"run {r.wall_s:.1f} s"
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
