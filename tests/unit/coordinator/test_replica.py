"""One replica of several (recovery/coordinator/replica.py, fenced.py): the engine runs only
while the replica leads, a standby refuses what needs the engine and names the leader, and a
leader deposed mid-incident stops at its next action, leaving it planned for the next leader,
who does it once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from recovery.coordinator.leader import Deposed, Elector
from recovery.coordinator.replica import NotLeader, Replica
from recovery.model import HealthEvent
from recovery.ports.journal import ActionStatus
from tests.fakes.lease import MemoryLease
from tests.fakes.slurm import FakeSlurm

from .helpers import Rig, event

DOWN = ("down", "n2", "recover: xid79 GPU has fallen off the bus")
TIMES = {"duration_s": 6.0, "renew_deadline_s": 4.0, "retry_s": 1.0}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Engine:
    """What a replica starts while it leads: records its life and answers status."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.running = False
        self.submitted: list[HealthEvent] = []

    def start(self) -> None:
        self.running = True

    def stop(self, timeout_s: float = 10.0) -> None:
        self.running = False

    def submit(self, events: Sequence[HealthEvent]) -> None:
        self.submitted += events

    def status(self) -> dict[str, Any]:
        return {"engine": self.name}

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def repaired(self, node: str) -> dict[str, Any]:
        return {}

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        return {}

    def look_at_node(self, node: str) -> dict[str, Any]:
        return {}

    def breaker(self) -> dict[str, Any]:
        return {}

    def breaker_reset(self) -> dict[str, Any]:
        return {}


def _replica(store: MemoryLease, clock: Clock, name: str, engines: list[Engine]) -> Replica:
    def start() -> Engine:
        engines.append(Engine(f"{name}#{len(engines)}"))
        return engines[-1]

    elector = Elector(store, name, clock, lambda: 1_800_000_000.0 + clock.t, **TIMES)
    return Replica(elector, start, log=lambda _m: None)


def test_only_the_leader_runs_an_engine_and_a_standby_names_it() -> None:
    store, clock = MemoryLease(), Clock()
    a_engines: list[Engine] = []
    b_engines: list[Engine] = []
    a = _replica(store, clock, "a", a_engines)
    b = _replica(store, clock, "b", b_engines)
    a.tick()
    b.tick()
    assert a.role().role == "leader"
    assert b.role().role == "standby"
    assert a.status() == {"engine": "a#0"}
    assert a_engines[0].running
    assert b_engines == []
    with pytest.raises(NotLeader, match="replica b stands by \\(a leads\\)"):
        b.status()
    b.submit([event("n1")])  # committed by the intake already: nothing to wake, no error
    # a dies (no more ticks); b takes over after the lease's duration, with a fresh engine.
    for _ in range(7):
        clock.t += 1.0
        b.tick()
    assert b.role().role == "leader"
    assert b.role().term == 2
    assert b.status() == {"engine": "b#0"}
    # a comes back: it learns it was replaced, stops its engine and stands by.
    a.tick()
    assert not a_engines[0].running
    with pytest.raises(NotLeader, match="b leads"):
        a.status()


def test_a_leader_that_cannot_renew_stops_its_engine_before_another_may_lead() -> None:
    store, clock = MemoryLease(), Clock()
    engines: list[Engine] = []
    a = _replica(store, clock, "a", engines)
    a.tick()
    store.down = True
    clock.t += 3.9
    a.tick()
    assert engines[0].running  # still within the renew deadline (4 s)
    clock.t += 0.2
    a.tick()
    assert not engines[0].running
    assert a.role().role == "standby"
    with pytest.raises(Deposed):
        a._elector.fence("drain n1")


class Gate:
    """The fence of a replica's lease: lets ``allow`` actions through, then deposes."""

    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.asked: list[str] = []

    def fence(self, what: str) -> None:
        self.asked.append(what)
        if len(self.asked) > self.allow:
            raise Deposed(f"not the leader: {what} not done")


def test_a_leader_deposed_mid_incident_stops_and_the_next_finishes_it_once(
    tmp_path: Path,
) -> None:
    gate = Gate(allow=1)  # the take-down passes; the lease is lost before the promotion
    rig = Rig(tmp_path / "journal.sqlite", FakeSlurm(["n1", "n2", "n3"], ["s1"]), fence=gate.fence)
    with pytest.raises(Deposed):
        rig.send(event("n2", "xid79"))
    assert rig.slurm.updates() == [DOWN]
    assert gate.asked == ["down n2", "resume s1"]
    promote = [a for a in rig.incident("n2").actions if a.action.kind == "promote"]
    # Left as the deposed leader found it: planned, no attempt counted, nothing failed.
    assert [(a.status, a.attempts) for a in promote] == [(ActionStatus.planned, 0)]
    gate.allow = 100  # the next leader (a new engine on the same journal)
    rig.restart().step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]
    assert [a.status for a in rig.incident("n2").actions] == [ActionStatus.done] * 2
    rig.restart().step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]


def test_a_round_that_fails_is_logged_and_the_election_goes_on() -> None:
    store, clock = MemoryLease(), Clock()
    logged: list[str] = []
    starts: list[int] = []

    def start() -> Engine:
        starts.append(1)
        if len(starts) == 1:
            raise RuntimeError("the engine could not be built")
        return Engine("a#1")

    elector = Elector(store, "a", clock, lambda: 1_800_000_000.0 + clock.t, **TIMES)
    replica = Replica(elector, start, log=logged.append)
    elector.retry_s = 0.01  # the thread's rounds, quickly
    replica.start()  # its first round fails: logged, and the next one builds the engine
    try:
        deadline = time.monotonic() + 10
        while replica.role().role != "leader":
            assert time.monotonic() < deadline, logged
            time.sleep(0.01)
    finally:
        replica.stop()
    assert any("the engine could not be built" in m for m in logged)
    assert len(starts) >= 2
