"""Jobs Slurm holds (REQUEUE_HOLD: 25.11's expedited requeue of a failed run, no Epilog
failed) that no node's fault claims: never left held without an incident that says why and
what was done. A run that asked to go on (75: saved on a signal; 76: a lost peer) is
released and followed until it runs again; anything else is explained and left held."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.contract.exits import EXIT_DO_NOT_RESTART, EXIT_PEER_LOST, EXIT_PREEMPTED
from recovery.contract.jobmark import job_comment
from recovery.coordinator.reconcile import HELD_GRACE_S, OUR_JOB_NAME, judge_held
from recovery.ports.journal import IncidentRecord, IncidentStatus
from recovery.ports.slurm import JobInfo
from tests.fakes.slurm import FakeSlurm
from tests.unit.coordinator.helpers import Rig, event

NODES = ["n1", "n2", "n3"]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(NODES, ["s1"]))


def ticks(rig: Rig, seconds: float) -> None:
    for _ in range(int(seconds / 0.5) + 1):
        rig.clock.advance(0.5)
        rig.engine.step()


def held_incidents(rig: Rig) -> list[IncidentRecord]:
    return [i for i in rig.journal.incidents() if i.fault == "job-held"]


@pytest.mark.parametrize("code", [EXIT_PREEMPTED, EXIT_PEER_LOST])
def test_a_held_run_that_asked_to_go_on_is_released_and_followed(rig: Rig, code: int) -> None:
    job = rig.slurm.run_job(["n1", "n2"], name=OUR_JOB_NAME)
    rig.engine.step()
    rig.slurm.fail_held(job, exit_code=code)
    ticks(rig, HELD_GRACE_S - 2)
    assert held_incidents(rig) == []  # a node's fault may still claim it
    ticks(rig, 4)
    (inc,) = held_incidents(rig)
    assert inc.node == "n1"  # where its run ran
    said = f"job {job} ({OUR_JOB_NAME}) is held by Slurm (REQUEUE_HOLD) after its run 0 ended"
    assert any(p.detail.startswith(said) for p in inc.phases if p.name == "decided")
    assert ("release", job) in rig.slurm.updates()
    assert inc.jobs == (job,)
    names = [p.name for p in inc.phases]
    assert "job-released" in names
    released = next(p.detail for p in inc.phases if p.name == "job-released")
    assert released.startswith(f"{job}: ")
    assert "released to continue" in released
    rig.slurm.start_job(job, ["n1", "n2"])
    ticks(rig, 1)
    (inc,) = held_incidents(rig)
    assert inc.status is IncidentStatus.closed
    assert {"jobs-requeued", "job-running", "closed"} <= {p.name for p in inc.phases}
    ticks(rig, HELD_GRACE_S + 2)
    assert len(held_incidents(rig)) == 1  # one incident, one release: nothing more
    assert rig.slurm.updates().count(("release", job)) == 1


@pytest.mark.parametrize(
    ("name", "code", "says"),
    [
        (OUR_JOB_NAME, 127, "failed on its own (FAILED exit 127, held by Slurm)"),
        (OUR_JOB_NAME, EXIT_DO_NOT_RESTART, "asked not to be restarted (exit 93)"),
    ],
)
def test_other_holds_are_explained_and_left_held(rig: Rig, name: str, code: int, says: str) -> None:
    job = rig.slurm.run_job(["n2"], name=name)
    rig.engine.step()
    rig.slurm.fail_held(job, exit_code=code)
    ticks(rig, HELD_GRACE_S + 2)
    (inc,) = held_incidents(rig)
    assert inc.status is IncidentStatus.closed
    closed = next(p.detail for p in inc.phases if p.name == "closed")
    assert closed.startswith("left held: ")
    assert says in closed
    assert ("release", job) not in rig.slurm.updates()
    assert rig.slurm.job(job).requeue_held
    ticks(rig, HELD_GRACE_S)
    assert len(held_incidents(rig)) == 1  # explained once


def test_another_users_held_job_is_left_to_them(rig: Rig) -> None:
    job = rig.slurm.run_job(["n2"], name="mine")
    rig.engine.step()
    rig.slurm.fail_held(job, exit_code=EXIT_PREEMPTED)
    ticks(rig, 2 * HELD_GRACE_S)
    assert held_incidents(rig) == []
    assert rig.slurm.job(job).requeue_held


def test_a_held_job_of_ours_under_another_name_is_released(rig: Rig) -> None:
    """``recover sbatch --job-name mine``: the comment's mark says it is ours."""
    job = rig.slurm.run_job(["n2"], name="mine", comment=job_comment(in_allocation=False))
    rig.engine.step()
    rig.slurm.fail_held(job, exit_code=EXIT_PREEMPTED)
    ticks(rig, HELD_GRACE_S + 2)
    (inc,) = held_incidents(rig)
    assert ("release", job) in rig.slurm.updates()
    assert inc.jobs == (job,)


def test_a_held_job_a_nodes_fault_claims_is_left_to_that_incident(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1"], name=OUR_JOB_NAME)
    rig.engine.step()
    rig.slurm.fail_held(job, exit_code=134)  # the training died with its GPU...
    rig.clock.advance(2)
    rig.send(event("n1", "xid79"))  # ...and the fault's report comes a moment later
    ticks(rig, HELD_GRACE_S + 2)
    assert held_incidents(rig) == []
    assert rig.incident("n1").fault == "xid79"


def test_a_coordinator_started_after_the_hold_explains_it_too(tmp_path: Path) -> None:
    slurm = FakeSlurm(NODES, ["s1"])
    job = slurm.run_job(["n3"], name=OUR_JOB_NAME)
    slurm.fail_held(job, exit_code=EXIT_PREEMPTED)
    rig = Rig(tmp_path / "journal.sqlite", slurm)  # a new coordinator, no memory of the job
    rig.engine.recover()
    ticks(rig, HELD_GRACE_S + 2)
    (inc,) = held_incidents(rig)
    assert ("release", job) in slurm.updates()
    assert inc.node == "n1"  # its run's node is not known any more: the first node


def test_the_release_budget_stops_a_job_that_keeps_stopping() -> None:
    job = JobInfo("7", OUR_JOB_NAME, "REQUEUE_HOLD", restart_count=4, reason="JobHeldUser",
                  exit_code=EXIT_PEER_LOST)  # fmt: skip
    assert judge_held(job, 2, 3)[0] is True
    release, why = judge_held(job, 3, 3)
    assert release is False
    assert "released 3 time(s) already" in why
