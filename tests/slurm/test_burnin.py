"""The burn-in of a node out of service, as a real job on the local cluster
(``slurm.burnin.SlurmBurnIn``): a spare is reserved, resumed, burned in with real JAX in two
processes, and put back drained with its reason; nothing else lands on it meanwhile; a node
whose slurmd is gone fails within the budget and stays out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.pool.spares import SPARE_REASON
from recovery.ports.slurm import BatchJob
from slurm.burnin import RESERVATION_PREFIX, SlurmBurnIn
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.slurm.helpers import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _reservations(ctl: CliSlurm) -> str:
    return ctl.run(["scontrol", "show", "reservation"]).strip()


def test_a_spare_is_burned_in_and_put_back_as_it_was(slurm_ctl: CliSlurm, tmp_path: Path) -> None:
    # A job that asks for the spare by name waits: the spare is drained. The burn-in resumes
    # the spare for a moment; the reservation must keep this job off it all along.
    waiting = slurm_ctl.submit(
        BatchJob("#!/bin/bash\nsleep 30\n", {"nodelist": "spare1", "job-name": "wants-spare1",
                 "output": str(tmp_path / "waiting.out")})
    )  # fmt: skip
    outcome = SlurmBurnIn(slurm_ctl, tmp_path / "burn").run("spare1", 240, SPARE_REASON)
    assert outcome.ok, outcome
    assert "2 process(es), product and collective right" in outcome.detail
    assert outcome.job_id
    assert outcome.took_s > 0
    spare = slurm_ctl.node("spare1")
    assert spare.drained
    assert spare.reason == SPARE_REASON
    burn = slurm_ctl.job(outcome.job_id)
    assert burn.state == "COMPLETED"
    assert burn.nodes == ("spare1",)
    job = slurm_ctl.job(waiting)
    assert job.state == "PENDING", job
    assert not job.nodes, job
    assert RESERVATION_PREFIX not in _reservations(slurm_ctl)


def test_a_peer_joins_the_collective_from_its_own_node_and_both_go_back_out(
    slurm_ctl: CliSlurm, tmp_path: Path
) -> None:
    """With a healthy peer (here node3, drained as a second spare), one process runs on each
    node, so the collective crosses between them; both are reserved, resumed and drained
    back with their own reasons."""
    peer_reason = "recover: spare (peer)"
    slurm_ctl.run(["scontrol", "update", "NodeName=node3", "State=DRAIN", f"Reason={peer_reason}"])
    outcome = SlurmBurnIn(slurm_ctl, tmp_path / "burn").run(
        "spare1", 240, SPARE_REASON, peer=("node3", peer_reason)
    )
    assert outcome.ok, outcome
    assert outcome.detail.endswith(", one on spare1 and one on the peer node3"), outcome
    assert slurm_ctl.job(outcome.job_id).nodes == ("node3", "spare1")
    for name, reason in (("spare1", SPARE_REASON), ("node3", peer_reason)):
        node = slurm_ctl.node(name)
        assert node.drained, node
        assert node.reason == reason
    assert RESERVATION_PREFIX not in _reservations(slurm_ctl)


def test_a_node_whose_slurmd_is_gone_fails_in_its_budget_and_stays_out(
    slurm_ctl: CliSlurm, slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    slurm_cluster.crash_node("spare1")
    outcome = SlurmBurnIn(slurm_ctl, tmp_path / "burn").run("spare1", 8, SPARE_REASON)
    assert not outcome.ok
    assert "did not finish within 8 s" in outcome.detail
    assert "cancelled" in outcome.detail
    spare = slurm_ctl.node("spare1")
    assert spare.drained
    assert spare.reason == SPARE_REASON
    wait_for(lambda: slurm_ctl.job(outcome.job_id).finished, 30, "the burn-in job cancelled")
    assert RESERVATION_PREFIX not in _reservations(slurm_ctl)


_IN_JOB = """\
import json, os, sys
from slurm.jobstep import JobSteps

steps = JobSteps.from_env()
nodes = steps.job_nodes()
spare = [n for n in nodes if n != os.environ["SLURMD_NODENAME"]][0]
good = steps.burn_in(spare, 180, peer=os.environ["SLURMD_NODENAME"])
bad = steps.burn_in(spare, 1.5)  # JAX alone takes longer to start
steps.hold(spare, "recover: check failed: burn-in: " + bad.detail[:60])
steps.release([n for n in nodes if n != spare])
print(json.dumps({"spare": spare, "host": os.environ["SLURMD_NODENAME"], "good": list(good),
                  "bad": list(bad), "left": steps.job_nodes()}))
"""


def test_a_spare_inside_a_job_is_burned_in_by_a_step_and_held_when_it_fails(
    slurm_ctl: CliSlurm, tmp_path: Path
) -> None:
    """What the in-allocation supervisor does with a spare of its job
    (``slurm.jobstep.JobSteps.burn_in``, ``hold``, ``release``), from inside a real job:
    the burn-in is a step of the job on the spare (real JAX, two processes and their
    collective); one that does not finish within its budget is ended and fails; the failed
    node is drained with its reason and leaves the job."""
    import sys

    program = tmp_path / "in_job.py"
    program.write_text(_IN_JOB)
    out = tmp_path / "job.out"
    job_id = slurm_ctl.submit(BatchJob(
        f"#!/bin/bash\nexec {sys.executable} {program}\n",
        {"nodes": "2", "no-kill": None, "job-name": "spare-check", "output": str(out)},
        workdir=str(tmp_path),
    ))  # fmt: skip
    wait_for(lambda: slurm_ctl.job(job_id).finished, 300, f"job {job_id} to end")
    text = out.read_text()
    assert slurm_ctl.job(job_id).state == "COMPLETED", text
    doc = json.loads(text.strip().splitlines()[-1])
    ok, detail, _job, took = doc["good"]
    assert ok, detail
    assert "2 process(es), product and collective right" in detail
    assert detail.endswith(f", one on {doc['spare']} and one on {doc['host']}"), detail
    assert took > 0
    failed, said, _job, _took = doc["bad"]
    assert not failed
    assert said.startswith("did not finish within 1.5 s"), said
    spare = slurm_ctl.node(doc["spare"])
    assert spare.drained
    assert spare.reason.startswith("recover: check failed: burn-in: did not finish"), spare
    assert doc["spare"] not in doc["left"]


def test_a_burn_in_left_by_a_killed_coordinator_is_put_back_node_by_node(
    slurm_ctl: CliSlurm, tmp_path: Path
) -> None:
    """A coordinator killed mid-burn-in leaves the reservation and its nodes resumed: the
    next start drains each node of the reservation with its journaled reason (the peer's
    too) and deletes it."""
    burn = SlurmBurnIn(slurm_ctl, tmp_path / "burn")
    slurm_ctl.run(["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=recover: x"])
    burn._reserve(RESERVATION_PREFIX + "spare1", ["spare1", "node3"], 60)
    for name in ("spare1", "node3"):
        slurm_ctl.resume(name)
    assert not slurm_ctl.node("spare1").drained
    put_back = burn.cleanup({"node3": "recover: spare (peer)"})
    assert sorted(put_back) == ["node3", "spare1"]
    assert slurm_ctl.node("spare1").reason == SPARE_REASON  # none journaled: a spare
    assert slurm_ctl.node("node3").reason == "recover: spare (peer)"
    assert all(slurm_ctl.node(n).drained for n in ("spare1", "node3"))
    assert RESERVATION_PREFIX not in _reservations(slurm_ctl)
