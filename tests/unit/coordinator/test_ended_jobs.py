"""Jobs a fault ended before Slurm could requeue them: found, recorded, requeued once.

The engine on a FakeSlurm (held to the real adapters by tests/slurm/test_port_contract.py),
a real SQLite journal and a fake clock. A job "dies" with ``fail_job`` (exit 134: its training
process was killed by SIGABRT while the batch shell lived on), at the clock's time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recover.render import render_incident
from recovery.contract.exits import EXIT_DO_NOT_RESTART
from recovery.contract.jobmark import job_comment
from recovery.policy import BreakerConfig, PolicyConfig
from recovery.policy.requeue import RequeueConfig
from recovery.ports.journal import IncidentStatus, RequeueOutcome
from service.httpapi.models import incident_detail
from tests.fakes.slurm import FakeSlurm
from tests.helpers import Crash

from .helpers import Rig, event

NODES = ["n1", "n2", "n3"]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(NODES, ["s1", "s2"]))


def requeues(rig: Rig) -> list[tuple[str, ...]]:
    return [c for c in rig.slurm.updates() if c[0] == "requeue"]


def test_the_process_dies_first_then_xid79_the_job_is_requeued_once(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.engine.step()
    rig.clock.advance(1)
    rig.slurm.fail_job(job)  # SIGABRT: FAILED, exit 134; Slurm sees a healthy node
    rig.clock.advance(2)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall - 0.5))
    rig.engine.step()  # the reconcile tick after the take-out
    assert rig.slurm.updates()[0] == ("down", "n1", "recover: xid79 GPU has fallen off the bus")
    assert requeues(rig) == [("requeue", job)]
    got = rig.slurm.job(job)
    assert (got.state, got.restart_count) == ("PENDING", 1)
    inc = rig.incident("n1")
    assert inc.jobs == (job,)
    assert inc.info["job_restarts"] == {job: 0}
    note = inc.info["requeues"][job]
    assert (note["outcome"], note["restart_count"]) == (RequeueOutcome.requeued, 0)
    assert note["ended"].startswith("FAILED exit 134 at ")
    assert "job-ended" in rig.phases("n1")
    detail = {p.name.value: p.detail for p in inc.phases}
    assert detail["jobs-requeued"].startswith(f"{job} (FAILED exit 134 at")
    assert detail["jobs-requeued"].endswith("requeued by the coordinator)")
    assert inc.status is IncidentStatus.open  # until the job runs again
    for _ in range(3):
        rig.engine.step()
    assert requeues(rig) == [("requeue", job)]  # never twice
    rig.slurm.start_job(job, ["n2"])
    rig.engine.step()
    assert rig.phases("n1")[-2:] == ["job-running", "closed"]


@pytest.mark.parametrize(("ended_before_s", "requeued"), [(120.0, True), (120.5, False)])
def test_the_window_before_the_fault(rig: Rig, ended_before_s: float, requeued: bool) -> None:
    job = rig.slurm.run_job(["n1"])
    fault_at = rig.clock.now().wall + 200
    rig.slurm.finish_job(job, "FAILED", exit_code=134, end_time=fault_at - ended_before_s)
    rig.clock.advance(201)
    rig.send(event("n1", "xid79", observed_at=fault_at))
    rig.engine.step()
    assert bool(requeues(rig)) is requeued
    inc = rig.incident("n1")
    assert inc.jobs == ((job,) if requeued else ())
    if not requeued:  # no job was the fault's: nothing to wait for
        assert inc.status is IncidentStatus.closed


def test_the_window_is_the_policys(tmp_path: Path) -> None:
    config = PolicyConfig(requeue=RequeueConfig(window_s=10))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), config=config)
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.clock.advance(30)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == []


def test_a_job_that_failed_on_a_healthy_node_is_left_alone(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.engine.step()
    rig.slurm.fail_job(job, 1)  # a bug in the job's own code; no fault anywhere
    for _ in range(5):
        rig.clock.advance(1)
        rig.engine.step()
    assert rig.slurm.updates() == []
    assert rig.journal.incidents() == []
    # A fault on another node later is no reason to touch it either.
    rig.send(event("n2", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == []
    assert rig.incident("n2").jobs == ()


def test_the_do_not_restart_status_is_never_requeued(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job, EXIT_DO_NOT_RESTART)
    rig.clock.advance(1)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    for _ in range(3):
        rig.engine.step()
    assert requeues(rig) == []
    inc = rig.incident("n1")
    assert inc.info["requeues"][job]["outcome"] == RequeueOutcome.refused
    detail = {p.name.value: p.detail for p in inc.phases}["requeue-refused"]
    assert detail == f"{job}: FAILED exit 93: exit 93 asks not to be restarted"
    assert inc.status is IncidentStatus.closed  # the job ended; nothing left to follow


def test_a_job_killed_by_a_signal_is_the_faults_too(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job, 0, signal=9)  # the batch shell itself was killed
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    assert rig.incident("n1").info["requeues"][job]["ended"].startswith("FAILED signal 9")


@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"])
def test_jobs_that_ended_otherwise_are_not_the_faults(rig: Rig, state: str) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.slurm.finish_job(job, state)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == []
    assert rig.incident("n1").jobs == ()


def test_a_job_slurm_requeued_at_the_take_out_is_not_requeued_again(rig: Rig) -> None:
    # The node taken out first: Slurm requeues the running job itself; its process dying a
    # moment later changes nothing.
    job = rig.slurm.run_job(["n1"])
    rig.send(event("n1", "xid79"))
    assert rig.slurm.job(job).restart_count == 1
    for _ in range(3):
        rig.engine.step()
    assert requeues(rig) == []
    rig.slurm.start_job(job, ["n2"])
    rig.engine.step()
    assert rig.incident("n1").status is IncidentStatus.closed


def test_drained_first_the_process_dies_a_moment_later_and_is_requeued(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.send(event("n1", "xid95"))  # drain-reset: drained, USR1 sent for a save
    assert rig.slurm.job(job).state == "RUNNING"
    rig.clock.advance(0.5)
    rig.slurm.fail_job(job)  # died before it could save
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    inc = rig.incident("n1")
    assert inc.info["requeues"][job]["outcome"] == RequeueOutcome.requeued
    saved = {p.name.value: p.detail for p in inc.phases}["jobs-saved"]
    assert saved == f"the jobs left the node; ended without a save: {job}"
    rig.clock.advance(61)  # past the save timeout: nothing left on the node to requeue
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    rig.slurm.start_job(job, ["n2"])
    rig.engine.step()
    assert rig.incident("n1").status is IncidentStatus.closed


def test_dying_between_the_decision_and_the_take_out_is_caught(rig: Rig) -> None:
    # Running when decided, ended (so not requeued by Slurm) before the DOWN landed; the
    # coordinator was killed just before the DOWN and restarted.
    job = rig.slurm.run_job(["n1"])
    rig.slurm.crash_before.add("down")
    with pytest.raises(Crash):
        rig.send(event("n1", "xid79"))
    rig.slurm.fail_job(job)
    rig.restart().step()
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    assert rig.incident("n1").jobs == (job,)


@pytest.mark.parametrize("kill", ["before the request", "after the request"])
def test_a_killed_coordinator_never_requeues_one_run_twice(rig: Rig, kill: str) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.slurm.crash_before.add("requeue")
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall), step=False)
    with pytest.raises(Crash):
        rig.engine.step()  # decided, node DOWN, spare promoted, then the requeue: killed
    note = rig.incident("n1").info["requeues"][job]
    assert note["outcome"] == RequeueOutcome.noted  # noted before the request
    if kill == "after the request":
        rig.slurm.requeue(job)  # it landed; the coordinator died before recording it
        rig.slurm.calls.clear()
    rig.restart().step()
    rig.engine.step()
    assert len(requeues(rig)) == (1 if kill == "before the request" else 0)
    assert rig.slurm.job(job).restart_count == 1
    assert rig.incident("n1").info["requeues"][job]["outcome"] == RequeueOutcome.requeued
    rig.restart().step()
    assert rig.slurm.job(job).restart_count == 1


def test_two_incidents_on_one_multi_node_job_requeue_it_once(tmp_path: Path) -> None:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=10, max_fraction=1.0))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1", "s2"]), config=config)
    job = rig.slurm.run_job(["n1", "n2", "n3"])
    rig.slurm.fail_job(job)
    now = rig.clock.now().wall
    rig.send(event("n1", "xid79", observed_at=now), event("n3", "xid79", observed_at=now))
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    notes = [rig.incident(n).info["requeues"][job] for n in ("n1", "n3")]
    assert sorted(n["detail"] for n in notes) == [
        "requeued already",
        "requeued by the coordinator",
    ]


def test_the_restart_budget(tmp_path: Path) -> None:
    config = PolicyConfig(requeue=RequeueConfig(budget=2, budget_window_s=3600))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm([*NODES, "n4", "n5"], ["s1", "s2", "s3"]),
              config=config)  # fmt: skip
    job = rig.slurm.run_job(["n1"])
    for i, node in enumerate(["n1", "n2", "n3"]):
        if i:
            rig.slurm.start_job(job, [node])
        rig.slurm.fail_job(job)
        rig.send(event(node, "xid79", observed_at=rig.clock.now().wall))
        rig.engine.step()
        rig.clock.advance(60)
    assert requeues(rig) == [("requeue", job)] * 2
    third = rig.incident("n3").info["requeues"][job]
    assert third["outcome"] == RequeueOutcome.refused
    assert (
        "restart budget spent (requeued 2 time(s) in the last 3600 s; at most 2)"
        in (third["detail"])
    )
    # The budget survives a restart (it is read back from the journal) and slides: an
    # hour after the first requeues the job may be requeued again.
    rig.restart()
    rig.clock.advance(3600)
    rig.slurm.set_job(job, state="RUNNING", nodes=("n4",), restart_count=3, end_time=0.0)
    rig.engine.step()
    rig.slurm.fail_job(job)
    rig.send(event("n4", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)] * 3


def test_a_budget_spent_before_a_restart_stays_spent(tmp_path: Path) -> None:
    config = PolicyConfig(requeue=RequeueConfig(budget=1))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1", "s2"]), config=config)
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    rig.restart()
    rig.slurm.start_job(job, ["n2"])
    rig.slurm.fail_job(job)
    rig.send(event("n2", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    assert rig.incident("n2").info["requeues"][job]["outcome"] == RequeueOutcome.refused


def test_a_no_requeue_job_is_recorded_and_left(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"], requeueable=False)
    rig.send(event("n1", "xid79"))  # DOWN: Slurm ends it NODE_FAIL instead of requeueing
    rig.engine.step()
    assert rig.slurm.job(job).state == "NODE_FAIL"
    assert requeues(rig) == []
    note = rig.incident("n1").info["requeues"][job]
    assert note["outcome"] == RequeueOutcome.refused
    assert "--no-requeue" in note["detail"]
    assert note["ended"].startswith("NODE_FAIL signal 15")


def test_restart_app_requeues_a_job_that_died_before_it(rig: Rig) -> None:
    # XID 94: the one context dies. The job ended before the restart-app requeue ran.
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.send(event("n1", "xid94", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    assert rig.slurm.node("n1").in_service


def test_dry_run_records_what_it_would_requeue(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), dry_run=True)
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert rig.slurm.updates() == []
    assert rig.incident("n1").info["requeues"][job]["outcome"] == RequeueOutcome.skipped


def test_a_held_take_out_holds_the_requeue_and_an_expired_one_refuses_it(
    tmp_path: Path,
) -> None:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=1, hold_max_age_s=60))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1", "s2"]), config=config)
    rig.send(event("n2", "xid79"))  # the breaker's one take-out
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))  # held
    rig.engine.step()
    assert requeues(rig) == []  # requeued now, it could land on n1 again
    assert "requeues" not in rig.incident("n1").info
    rig.clock.advance(61)
    rig.engine.step()  # the held take-out expired: the node never went out
    note = rig.incident("n1").info["requeues"][job]
    assert (note["outcome"], requeues(rig)) == (RequeueOutcome.refused, [])
    assert "never ran" in note["detail"]


def test_a_slurmd_crash_records_the_job_slurm_requeued_from_the_node(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1", "n2"])
    rig.engine.step()  # a tick sees the job on n1 and n2 at restart count 0
    # slurmd on n2 dies: Slurm sets n2 DOWN and requeues the job in one instant. On its other
    # node the job shows COMPLETING at its new count, n2 already gone from its list.
    down_at = rig.clock.now().wall + 1
    rig.slurm.set_node("n2", state="DOWN", flags=frozenset({"NOT_RESPONDING"}),
                       reason="Not responding", reason_changed_at=down_at)  # fmt: skip
    rig.slurm.set_job(job, state="COMPLETING", nodes=("n1",), restart_count=1)
    rig.clock.advance(1.5)
    rig.engine.step()  # node-unreachable event
    rig.engine.step()  # decided
    inc = rig.incident("n2")
    assert (inc.fault, inc.jobs, inc.info["job_restarts"]) == ("node-unreachable", (job,),
                                                              {job: 0})  # fmt: skip
    assert "jobs-requeued" in rig.phases("n2")
    assert requeues(rig) == []  # Slurm requeued it: not ours
    rig.slurm.start_job(job, ["n3", "s1"])
    rig.engine.step()
    assert rig.phases("n2")[-2:] == ["job-running", "closed"]


def test_a_single_node_job_slurm_requeued_from_a_crashed_node_is_recorded(rig: Rig) -> None:
    job = rig.slurm.run_job(["n3"])
    rig.engine.step()
    rig.slurm.set_node("n3", state="DOWN", flags=frozenset({"NOT_RESPONDING"}),
                       reason="Not responding", reason_changed_at=rig.clock.now().wall)  # fmt: skip
    rig.slurm.set_job(job, state="PENDING", nodes=(), restart_count=1)
    rig.engine.step()
    rig.engine.step()
    assert rig.incident("n3").jobs == (job,)


def test_a_job_requeued_from_the_node_long_before_is_not_this_faults(rig: Rig) -> None:
    job = rig.slurm.run_job(["n3"])
    rig.engine.step()
    rig.slurm.set_job(job, state="RUNNING", nodes=("n1",), restart_count=1)  # moved away
    rig.clock.advance(300)
    rig.engine.step()
    rig.send(event("n3", "xid79", observed_at=rig.clock.now().wall))
    assert rig.incident("n3").jobs == ()


def test_recover_incidents_shows_the_jobs_and_their_requeues(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.slurm.fail_job(job)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    rig.engine.step()
    inc = rig.incident("n1")
    doc = incident_detail(inc, []).model_dump(mode="json")
    text = render_incident(doc)
    assert f"jobs: {job}" in text
    assert f"job {job} (FAILED exit 134 at " in text
    assert "): requeued: requeued by the coordinator" in text
    assert "job-ended" in text


def test_an_incident_that_moves_no_jobs_follows_only_the_live_ones(rig: Rig) -> None:
    live = rig.slurm.run_job(["n1"])
    failed = rig.slurm.run_job(["n1"])
    moved = rig.slurm.run_job(["n1"])
    rig.engine.step()  # the trail sees all three on n1
    rig.slurm.fail_job(failed)
    rig.slurm.set_job(moved, state="RUNNING", nodes=("n2",), restart_count=1)
    rig.engine.step()
    watch = rig.engine.watch  # the engine's own, as the decision uses it
    now = rig.clock.now().wall
    listing = [rig.slurm.job(j) for j in (live, failed)]
    by_id = {j.job_id: j for j in rig.slurm.jobs()}
    assert watch.at_decision("n1", now, listing, by_id, now) == {live: 0, failed: 0, moved: 0}
    assert watch.at_decision("n1", now, listing, by_id, now, moves_jobs=False) == {live: 0}


# --- Slurm 25.11: an expedited job whose script failed with no failed Epilog is held ----------


def releases(rig: Rig) -> list[tuple[str, ...]]:
    return [c for c in rig.slurm.updates() if c[0] == "release"]


def test_a_job_slurm_holds_after_the_process_died_first_is_released_once(rig: Rig) -> None:
    """The training died before the fault was reported, so our Epilog found no incident and
    passed; Slurm 25.11 requeued the expedited job but holds it. The fault's incident
    releases it (its requeue) and follows it until it runs again."""
    job = rig.slurm.run_job(["n1"])
    rig.engine.step()  # a tick sees the job on n1 at restart count 0
    rig.clock.advance(1)
    rig.slurm.fail_held(job)
    rig.engine.step()
    assert rig.journal.incidents() == []  # a held job says nothing by itself
    rig.clock.advance(2)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall - 0.5))
    rig.engine.step()
    assert releases(rig) == [("release", job)]
    assert requeues(rig) == []
    got = rig.slurm.job(job)
    assert (got.state, got.restart_count) == ("PENDING", 1)
    inc = rig.incident("n1")
    assert inc.jobs == (job,)
    assert inc.info["job_restarts"] == {job: 0}
    note = inc.info["requeues"][job]
    assert (note["outcome"], note["restart_count"]) == (RequeueOutcome.requeued, 0)
    assert note["ended"] == "FAILED exit 134, held by Slurm"
    detail = {p.name.value: p.detail for p in inc.phases}
    assert detail["job-ended"] == f"{job} FAILED exit 134, held by Slurm"
    assert detail["jobs-requeued"].endswith("requeued by the coordinator)")
    assert inc.status is IncidentStatus.open  # until the job runs again
    for _ in range(3):
        rig.engine.step()
    assert releases(rig) == [("release", job)]  # never twice
    rig.slurm.start_job(job, ["n2"])
    rig.engine.step()
    assert rig.phases("n1")[-2:] == ["job-running", "closed"]


def test_a_held_job_with_the_do_not_restart_status_stays_held(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.engine.step()
    rig.slurm.fail_held(job, EXIT_DO_NOT_RESTART)
    rig.send(event("n1", "xid79", observed_at=rig.clock.now().wall))
    for _ in range(3):
        rig.engine.step()
    assert releases(rig) == []
    assert rig.slurm.job(job).state == "REQUEUE_HOLD"
    inc = rig.incident("n1")
    assert inc.info["requeues"][job]["outcome"] == RequeueOutcome.refused
    assert inc.status is IncidentStatus.closed  # nothing left to follow


def test_a_held_job_of_a_healthy_node_is_left_alone(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"])
    rig.engine.step()
    rig.slurm.fail_held(job, 1)
    rig.send(event("n2", "xid79", observed_at=rig.clock.now().wall))
    for _ in range(3):
        rig.engine.step()
    assert releases(rig) == []
    assert rig.incident("n2").jobs == ()


def test_a_job_completing_without_the_node_is_followed_and_requeued(rig: Rig) -> None:
    """A multi-node job whose process on n1 died first: the step is killed everywhere and
    n1's Epilog finishes soonest, so while the event is decided Slurm shows the job
    COMPLETING on n2 and n3 only (measured on 22.05: squeue lists only the nodes a
    completing job has not released), then FAILED on all three. The incident must follow
    it all the same, not close at once with "no job ran on the node"."""
    job = rig.slurm.run_job(["n1", "n2", "n3"])
    rig.engine.step()  # a tick sees the job on n1, n2 and n3
    rig.slurm.set_job(job, state="COMPLETING", nodes=("n2", "n3"))
    rig.clock.advance(0.5)
    rig.send(event("n1", "gpu-lost", observed_at=rig.clock.now().wall - 0.3))
    rig.engine.step()
    inc = rig.incident("n1")
    assert (inc.jobs, inc.info["job_restarts"]) == ((job,), {job: 0})
    assert inc.status is IncidentStatus.open
    rig.clock.advance(2)
    rig.slurm.fail_job(job)
    rig.slurm.set_job(job, nodes=("n1", "n2", "n3"))
    rig.engine.step()
    assert requeues(rig) == [("requeue", job)]
    rig.slurm.start_job(job, ["n2", "n3", "s1"])
    rig.engine.step()
    assert rig.phases("n1")[-2:] == ["job-running", "closed"]


def test_a_job_completing_elsewhere_that_never_ran_on_the_node_is_not_followed(
    rig: Rig,
) -> None:
    job = rig.slurm.run_job(["n2", "n3"])
    rig.engine.step()
    rig.slurm.set_job(job, state="COMPLETING", nodes=("n3",))
    rig.send(event("n1", "gpu-lost", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert rig.incident("n1").jobs == ()


def test_a_job_left_running_without_its_batch_host_is_requeued_once(rig: Rig) -> None:
    """Slurm 25.11 drops a DOWN batch host from a --no-kill job (one carrying its own spares)
    before the coordinator looks, and leaves the job RUNNING with no batch script: nothing
    supervises it and only its time limit would end it. The coordinator requeues it."""
    job = rig.slurm.run_job(["n1", "n2"])
    rig.slurm.set_job(job, batch_host="n1")
    rig.engine.step()  # a tick sees the job on n1 and n2
    down_at = rig.clock.now().wall + 1
    rig.slurm.set_node("n1", state="DOWN", flags=frozenset({"NOT_RESPONDING"}),
                       reason="Not responding", reason_changed_at=down_at)  # fmt: skip
    rig.slurm.set_job(job, nodes=("n2",))
    rig.clock.advance(1.5)
    rig.engine.step()  # node-unreachable event
    rig.engine.step()  # decided; the ended-jobs step
    inc = rig.incident("n1")
    assert (inc.jobs, inc.info["job_restarts"]) == ((job,), {job: 0})
    assert requeues(rig) == [("requeue", job)]
    note = inc.info["requeues"][job]
    assert (note["outcome"], note["ended"]) == (RequeueOutcome.requeued,
                                                "RUNNING without its batch host n1")  # fmt: skip
    assert "in-allocation" not in rig.phases("n1")
    for _ in range(3):
        rig.engine.step()
    assert requeues(rig) == [("requeue", job)]  # never twice
    rig.slurm.start_job(job, ["n2", "n3"])
    rig.engine.step()
    assert rig.phases("n1")[-2:] == ["job-running", "closed"]


def test_a_job_that_lost_another_node_than_its_batch_host_is_left_to_its_supervisor(
    rig: Rig,
) -> None:
    job = rig.slurm.run_job(["n1", "n2"])
    rig.slurm.set_job(job, batch_host="n1")
    rig.engine.step()
    down_at = rig.clock.now().wall + 1
    rig.slurm.set_node("n2", state="DOWN", flags=frozenset({"NOT_RESPONDING"}),
                       reason="Not responding", reason_changed_at=down_at)  # fmt: skip
    rig.slurm.set_job(job, nodes=("n1",))
    rig.clock.advance(1.5)
    rig.engine.step()
    rig.engine.step()
    assert requeues(rig) == []


def test_a_hang_of_a_job_with_spares_is_left_to_its_supervisor(rig: Rig) -> None:
    """rank-hang on a job that recovers inside its allocation: its supervisor relaunches it
    (recovery/inalloc/hang.py); a requeue would throw its allocation away. A plain job on
    the same node is requeued as before."""
    own = rig.slurm.run_job(["n1", "n2"], comment=job_comment(in_allocation=True))
    plain = rig.slurm.run_job(["n1"], comment=job_comment(in_allocation=False))
    rig.send(event("n1", "rank-hang", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == [("requeue", plain)]
    inc = rig.incident("n1")
    assert inc.info["supervised"] == [own]
    detail = {p.name.value: p.detail for p in inc.phases}
    assert detail["left-to-job"] == f"{own}: its supervisor relaunches it inside its allocation"
    assert rig.slurm.job(own).state == "RUNNING"
    rig.slurm.start_job(plain, ["n1"])
    rig.engine.step()
    assert "in-allocation" in rig.phases("n1")
    assert rig.incident("n1").status is IncidentStatus.closed


def test_a_node_fault_on_a_job_with_spares_is_not_left_to_it(rig: Rig) -> None:
    """xid94 (restart the application, node kept): the supervisor does not see it in the
    progress records; the coordinator requeues the job as before (docs/in-allocation.md)."""
    own = rig.slurm.run_job(["n1", "n2"], comment=job_comment(in_allocation=True))
    rig.send(event("n1", "xid94", observed_at=rig.clock.now().wall))
    rig.engine.step()
    assert requeues(rig) == [("requeue", own)]
    assert "supervised" not in rig.incident("n1").info


def test_a_slow_node_is_an_incident_with_no_action_open_while_its_job_runs(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "node-slow", observed_at=rig.clock.now().wall))
    rig.engine.step()
    inc = rig.incident("n2")
    assert (inc.verdict, inc.actions, inc.jobs) == ("observe", (), (job,))
    assert rig.slurm.updates() == []  # reported, nothing done to the node or the job
    assert rig.slurm.node("n2").in_service
    assert inc.status is IncidentStatus.open  # the job still waits for it every step
    rig.slurm.finish_job(job)
    rig.engine.step()
    assert rig.incident("n2").status is IncidentStatus.closed
