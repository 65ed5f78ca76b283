"""The engine end to end on a FakeSlurm and a real SQLite journal: decisions become Slurm
actions, each recorded with its outcome and the incident's phases."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.policy import BreakerConfig, PolicyConfig, RepairCheck
from recovery.ports.journal import ActionStatus, IncidentStatus
from recovery.ports.slurm import JobInfo
from tests.fakes.slurm import FakeSlurm

from .helpers import Rig, event

NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(NODES, ["s1"]))


def test_xid79_takes_the_node_down_requeues_and_promotes_a_spare(rig: Rig) -> None:
    job = rig.slurm.run_job(NODES)
    rig.send(event("n2", "xid79"))
    assert rig.slurm.updates() == [
        ("down", "n2", "recover: xid79 GPU has fallen off the bus"),
        ("resume", "s1"),
    ]
    inc = rig.incident("n2")
    assert (inc.verdict, inc.jobs, inc.info["spare"]) == ("replace", (job,), "s1")
    assert inc.info["path"].startswith("down-requeue")
    assert [a.status for a in inc.actions] == [ActionStatus.done, ActionStatus.done]
    # Slurm requeued the job (down does that for --requeue jobs); it runs again elsewhere.
    rig.engine.step()
    assert "jobs-requeued" in rig.phases("n2")
    assert rig.incident("n2").status is IncidentStatus.open
    rig.slurm.start_job(job, ["n1", "n3", "n4", "s1"])
    rig.engine.step()
    assert rig.phases("n2") == [
        "fault",
        "received",
        "decided",
        "node-down",
        "spare-promoted",
        "jobs-requeued",
        "job-running",
        "closed",
    ]
    assert rig.incident("n2").status is IncidentStatus.closed


def test_nodes_failing_alike_go_down_in_one_slurm_call(tmp_path: Path) -> None:
    nodes = [f"n{i}" for i in range(1, 21)]
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=100, max_fraction=1.0))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(nodes), config=config)
    rig.send(*(event(n, "xid79") for n in nodes[:8]))
    downs = [c for c in rig.slurm.updates() if c[0] == "down"]
    assert downs == [
        ("down", ",".join(sorted(nodes[:8])), "recover: xid79 GPU has fallen off the bus")
    ]
    # Each incident records the empty pool once and waits for a spare.
    inc = rig.incident("n3")
    assert [a.status for a in inc.actions] == [ActionStatus.done, ActionStatus.waiting]
    assert "no-spare" in rig.phases("n3")


def test_xid94_requeues_the_job_and_keeps_the_node(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.send(event("n1", "xid94"))
    assert rig.slurm.updates() == [("requeue", job)]
    assert rig.slurm.node("n1").in_service
    assert "jobs-requeued" in rig.phases("n1")


def test_drain_reset_saves_first_then_requeues_at_the_deadline(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n1", "xid95"))
    assert rig.slurm.updates()[:2] == [
        ("drain", "n1", "recover: xid95 Uncontained ECC error"),
        ("signal", job, "USR1"),
    ]
    assert rig.incident("n1").info["path"] == "save-then-requeue"
    save = next(a for a in rig.incident("n1").actions if a.action.kind == "save-requeue")
    assert save.status is ActionStatus.waiting
    rig.engine.step()
    assert ("requeue", job) not in rig.slurm.updates()  # still within the save timeout
    rig.clock.advance(61)
    rig.engine.step()
    assert ("requeue", job) in rig.slurm.updates()
    assert "save-timeout" in rig.phases("n1")


def test_drain_reset_done_when_the_job_saved_and_left(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n1", "xid95"))
    # Training answered USR1: it saved, exited 75, and the wrapper requeued it.
    rig.slurm.requeue(job)
    rig.engine.step()
    assert "jobs-saved" in rig.phases("n1")
    assert [c for c in rig.slurm.updates() if c[0] == "requeue"] == [("requeue", job)]


def test_empty_pool_waits_and_promotes_once_a_spare_is_retired(rig: Rig) -> None:
    rig.send(event("n1", "xid79"))
    rig.send(event("n2", "xid79"))  # takes the only spare's place? no: s1 went to n1
    second = rig.incident("n2")
    assert second.actions[-1].status is ActionStatus.waiting
    rig.engine.repaired("n1")  # n1 goes back into the pool as a spare
    rig.engine.step()
    assert rig.incident("n2").info["spare"] == "n1"
    assert rig.incident("n2").actions[-1].status is ActionStatus.done


def test_dry_run_records_decisions_and_applies_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), dry_run=True)
    rig.send(event("n1", "xid79"))
    assert rig.slurm.updates() == []
    assert {a.status for a in rig.incident("n1").actions} == {ActionStatus.skipped}


def test_repair_of_a_node_we_did_not_take_out_is_refused(rig: Rig) -> None:
    rig.engine.step()
    with pytest.raises(UsageError, match="not taken out by recover"):
        rig.engine.repaired("n1")
    with pytest.raises(UsageError, match="Known: n1, n2"):
        rig.engine.repaired("nope")


def test_transient_errors_are_retried_then_the_action_completes(rig: Rig) -> None:
    rig.engine.step()
    rig.slurm.unavailable = 2  # the two attempts of the first tick fail
    rig.send(event("n1", "xid79"), step=False)
    rig.engine.decide_pending()
    rig.engine.executor.run_pending()
    down = rig.incident("n1").actions[0]
    assert (down.status, down.attempts) == (ActionStatus.planned, 1)
    rig.engine.step()
    assert rig.incident("n1").actions[0].status is ActionStatus.done


class _Silent:
    """A heartbeat tracker in which the named nodes went silent."""

    def __init__(self) -> None:
        self.nodes: list[str] = []

    def silent(self, now: float, after_s: float) -> list[str]:
        return list(self.nodes)


def test_a_silent_agent_makes_its_node_a_suspect_once(tmp_path: Path) -> None:
    beats = _Silent()
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), heartbeats=beats)
    rig.engine.step()
    beats.nodes = ["n3"]
    rig.engine.step()
    rig.engine.step()
    lost = [s for s, _ in rig.journal.history() if s.event.fault == "heartbeat-lost"]
    assert [s.event.node for s in lost] == ["n3"]  # one event per silence, not per tick
    assert {r["name"]: r["suspect"] for r in rig.engine.nodes()}["n3"] is True
    assert rig.slurm.updates() == []  # the policy treats it as a suspect only
    beats.nodes = []
    rig.engine.step()
    assert not any(r["suspect"] for r in rig.engine.nodes())


class _Check:
    """A repair check that passes for the nodes in ``healthy``; counts its runs."""

    def __init__(self) -> None:
        self.healthy: set[str] = set()
        self.runs = 0

    def passes(self, node: str) -> bool:
        self.runs += 1
        return node in self.healthy


def test_a_passing_repair_check_returns_the_node_to_the_pool(tmp_path: Path) -> None:
    config = PolicyConfig(repair_check=RepairCheck(("check", "{node}"), interval_s=60))
    check = _Check()
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), config=config, checker=check)
    rig.send(event("n2", "xid79"))
    rig.engine.step()
    assert check.runs == 1  # n2 is out: checked, still failing
    rig.engine.step()
    assert check.runs == 1  # not again within the interval
    check.healthy.add("n2")
    rig.clock.advance(61)
    rig.engine.step()
    n2 = rig.slurm.node("n2")
    assert n2.drained
    assert n2.reason == "recover: spare"
    assert "returned-to-pool" in rig.phases("n2")
    rig.clock.advance(61)
    rig.engine.step()
    assert check.runs == 2  # back in the pool: no longer checked


@pytest.mark.parametrize(
    ("state", "active"),
    [("PENDING", True), ("CONFIGURING", True), ("RUNNING", True), ("SUSPENDED", True),
     ("COMPLETING", True), ("COMPLETED", False), ("CANCELLED", False), ("NODE_FAIL", False)],
)  # fmt: skip
def test_a_job_is_active_until_it_ends(state: str, active: bool) -> None:
    assert JobInfo("7", "train", state).active is active


def test_the_incident_follows_only_the_jobs_still_active_on_the_node(rig: Rig) -> None:
    live = rig.slurm.run_job(["n1", "n2"])
    ended = rig.slurm.run_job(["n2"])
    rig.slurm.finish_job(ended)
    rig.send(event("n2", "xid79"))
    inc = rig.incident("n2")
    assert inc.jobs == (live,)
    assert inc.info.get("job_restarts") == {live: 0}
