"""The decision benchmark's rig: a coordinator on a timed fake Slurm, a storm of events, and
the per-event latencies read back from the journal. The command and its report are
:mod:`benchmarks.decision_bench`; the HTTP path is :mod:`benchmarks.decision_http`."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.coordinator.build import build_engine
from recovery.coordinator.engine import Engine
from recovery.coordinator.rules import Rules
from recovery.coordinator.views import LAYOUT_KEY
from recovery.model import HealthEvent, PromoteSpare, Source, TakeDown
from recovery.policy import BreakerConfig, PolicyConfig, load_catalogue
from recovery.ports.clock import Clock, SystemClock
from recovery.ports.journal import ActionStatus, IncidentRecord, Journal, PhaseName
from service.journaldb.journal import SqliteJournal
from tests.fakes.slurm import FakeSlurm

MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
POLICIES = ("raised", "default")
#: Seconds a run waits for the engine's worker to stop after the storm settled.
STOP_WAIT_S = 10.0
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
    http: bool = False
    """Send the events through the real HTTP intake in a server process (else append)."""


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
    """Every event decided and no take-down or promotion left to apply: held ones stay held,
    and a promotion tried once without a spare stays waiting."""
    if journal.undecided():
        return False
    return not any(
        isinstance(r.action, TakeDown | PromoteSpare) and r.status == ActionStatus.planned
        for r in journal.pending_actions()
    )


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
    path: str
    """How the events came in: ``append`` (journal.append_events in-process) or ``http``."""
    intake: dict[str, Any] | None = None
    """``http`` only: seconds from sending each POST to its answer (after the commit)."""
    from_send: dict[str, Any] | None = None
    """``http`` only: ``decision`` and ``takedown`` measured from sending the POST instead
    of from the receipt."""


def _phase(inc: IncidentRecord, name: PhaseName) -> float | None:
    return next((p.at.mono for p in inc.phases if p.name == name), None)


def measure(
    journal: Journal, storm_ids: set[str], sent: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """Per-event latencies of the storm, from the journal's incidents and their stamps:
    from each event's receipt, or from when it was ``sent`` (event id -> monotonic seconds,
    comparable between processes of one boot) when given."""
    decision, takedown, held = Latencies(), Latencies(), Latencies()
    first, last_decided, last_done, promoted = math.inf, 0.0, 0.0, 0
    for inc in journal.incidents():
        ours = storm_ids.intersection(inc.event_ids)
        if not ours:
            continue
        received, decided = _phase(inc, PhaseName.received), _phase(inc, PhaseName.decided)
        if received is None or decided is None:
            continue
        if sent is not None:
            received = min(sent[e] for e in ours)
        first, last_decided = min(first, received), max(last_decided, decided)
        decision.values.append(decided - received)
        for rec in inc.actions:
            if rec.status == ActionStatus.held and isinstance(rec.action, TakeDown):
                held.values.append(decided - received)
            if rec.status == ActionStatus.done and rec.finished is not None:
                if isinstance(rec.action, TakeDown):
                    takedown.values.append(rec.finished.mono - received)
                    last_done = max(last_done, rec.finished.mono)
                elif isinstance(rec.action, PromoteSpare):
                    promoted += 1
    return {
        "decision": decision.summary(),
        "takedown": takedown.summary(),
        "held": held.summary(),
        "promoted": promoted,
        "all_decided_s": last_decided - first if decision.values else None,
        "all_done_s": last_done - first if takedown.values else None,
    }


@dataclass
class Rig:
    """The coordinator under test: the real engine and rules over a fresh journal and a timed
    fake Slurm."""

    engine: Engine
    slurm: TimedSlurm
    journal: SqliteJournal
    clock: Clock


def build_rig(opts: Options, size: int, policy_name: str, db: Path) -> Rig:
    """A coordinator (not started) for a storm of ``size`` under ``policy_name``, journal at
    ``db``."""
    clock = SystemClock()
    journal = SqliteJournal(db, clock)
    slurm = build_slurm(opts)
    rules = Rules(policy(policy_name, size), CATALOGUE)
    engine = build_engine(journal=journal, slurm=slurm, clock=clock, rules=rules)
    return Rig(engine, slurm, journal, clock)


def result(
    size: int, policy_name: str, journal: Journal, ids: set[str], finished: bool, **extra: Any
) -> Result:
    """The run's figures, read back from ``journal``; ``extra`` are the Slurm call counts and
    the run's wall time."""
    m = measure(journal, ids)
    return Result(
        storm=size,
        policy=policy_name,
        finished=finished,
        decided=int(m["decision"]["count"]),
        **{k: m[k] for k in ("decision", "takedown", "held", "promoted")},
        all_decided_s=m["all_decided_s"],
        all_done_s=m["all_done_s"],
        **extra,
    )


def slurm_counts(slurm: FakeSlurm) -> dict[str, int]:
    """How many Slurm updates and reads the coordinator made."""
    reads = sum(1 for c in slurm.calls if c[0] in ("nodes", "jobs"))
    return {"slurm_updates": len(slurm.updates()), "slurm_reads": reads}


def run_one(opts: Options, size: int, policy_name: str, workdir: Path) -> Result:
    """One storm of ``size`` nodes on a fresh coordinator under ``policy_name``, appended
    in-process the way the intake's commit thread does."""
    rig = build_rig(opts, size, policy_name, workdir / f"journal-{size}-{policy_name}.db")
    engine, journal, clock = rig.engine, rig.journal, rig.clock
    began = time.monotonic()
    engine.start()
    try:
        # The first step reads the cluster and records its layout: wait for it to be ready.
        wait_until(lambda: journal.get_meta(LAYOUT_KEY) is not None, began + opts.deadline_s)
        events = storm(opts, size, clock)
        inject(journal, engine, events, clock, opts)
        finished = wait_until(lambda: settled(journal), time.monotonic() + opts.deadline_s)
    finally:
        # Bounded: a worker busy with a long step is left to finish it on its own.
        engine.stop(timeout_s=STOP_WAIT_S)
    out = result(
        size,
        policy_name,
        journal,
        {e.id for e in events},
        finished,
        **slurm_counts(rig.slurm),
        wall_s=time.monotonic() - began,
        path="append",
    )
    journal.close()
    return out
