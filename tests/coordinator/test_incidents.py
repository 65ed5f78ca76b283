"""The coordinator against real slurmctld/slurmd: health events in, Slurm actions out.

The training job asks for every in-service node (3 of 3), so after a node is lost it can only
run again once a spare is promoted: the replacement is real, not hidden by an idle node.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from recovery.ports.slurm import JobInfo
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.coordinator.helpers import Coordinator, control_digest, events, phases
from tests.helpers import submit_train
from tests.slurm.helpers import SLURMD_TIMEOUT_S, down_node, running, submit_loop, wait_for

pytestmark = pytest.mark.slurm

TRAIN = ["--steps", "24", "--save-every", "4", "--model", "mlp-tiny", "--step-sleep", "0.25"]


def _checkpointed(run: Path, step: int) -> bool:
    return any(e["event"] == "checkpoint" and e["step"] >= step for e in events(run))


def _batch_node(ctl: CliSlurm, job_id: str) -> str:
    job = wait_for(lambda: running(ctl, job_id), 60, "the training job running")
    return job.nodes[0]  # the batch script runs on the allocation's first node


def _completed(ctl: CliSlurm, job_id: str) -> JobInfo | None:
    job = ctl.job(job_id)
    return job if job.state == "COMPLETED" else None


# Slow (not in the quick tier); `recover demo` makes the same journey (xid79 through an agent,
# node DOWN, spare promoted, the job resumed and bit exact), with the report on top.
@pytest.mark.slow
def test_xid79_node_replaced_by_the_spare_and_training_ends_bit_exact(
    coordinator: Coordinator, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id, _ = submit_train(slurm_ctl, job_dir, "run", TRAIN, nodes=3)
    node = _batch_node(slurm_ctl, job_id)
    wait_for(lambda: _checkpointed(job_dir / "run", 4), 120, "a checkpoint at step 4")
    coordinator.send(node, "xid79")

    down = wait_for(lambda: down_node(slurm_ctl, node), 20, f"{node} DOWN")
    assert down.reason == "recover: xid79 GPU has fallen off the bus"
    # A resumed node is NOT_RESPONDING until slurmctld's next ping reaches its slurmd.
    wait_for(lambda: slurm_ctl.node("spare1").in_service, 30, "spare1 in service")
    done = wait_for(lambda: _completed(slurm_ctl, job_id), 180, "the job completed", 1.0)
    assert done.restart_count == 1
    assert node not in done.nodes
    assert "spare1" in done.nodes

    (completed,) = [e for e in events(job_dir / "run") if e["event"] == "completed"]
    assert completed["state_digest"] == control_digest(job_dir / "control", TRAIN)
    inc = wait_for(lambda: (i := coordinator.incident_on(node)) and i["status"] == "closed" and i,
                   30, "the incident closed")  # fmt: skip
    assert phases(inc) == [
        "fault", "received", "decided", "node-down", "spare-promoted",
        "jobs-requeued", "job-running", "closed",
    ]  # fmt: skip
    assert inc["jobs"] == [job_id]
    assert coordinator.scontrol_updates() == [
        f"update NodeName={node} State=DOWN Reason=recover: xid79 GPU has fallen off the bus",
        "update NodeName=spare1 State=RESUME",
    ]
    # The work as /metrics tells it (the real coordinator's metering journal).
    text = httpx.get(f"{coordinator.client.url}/metrics", timeout=10).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    assert samples[("recover_decisions_total", (("fault", "xid79"), ("verdict", "replace")))] == 1
    assert samples[("recover_actions_total", (("kind", "down"), ("outcome", "done")))] == 1
    assert samples[("recover_actions_total", (("kind", "promote"), ("outcome", "done")))] == 1
    assert samples[("recover_incident_phase_seconds_count", (("phase", "job-running"),))] == 1
    assert samples[("recover_incidents_closed_total", ())] == 1
    assert samples[("recover_spares_ready", ())] == 0  # spare1 took the job


@pytest.mark.slow
def test_xid94_requeues_the_job_and_keeps_the_node(
    coordinator: Coordinator, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit_loop(slurm_ctl, job_dir)
    (node,) = wait_for(lambda: running(slurm_ctl, job_id), 30, "the job running").nodes
    coordinator.send(node, "xid94")

    def rerun() -> JobInfo | None:
        job = running(slurm_ctl, job_id)
        return job if job is not None and job.restart_count == 1 else None

    again = wait_for(rerun, 60, "the job running again after its requeue")
    assert again.restart_count == 1
    assert slurm_ctl.node(node).in_service
    inc = coordinator.incident_on(node)
    assert inc is not None
    assert (inc["verdict"], "jobs-requeued" in phases(inc)) == ("restart-app", True)
    assert coordinator.scontrol_changes() == [f"requeue {job_id}"]


@pytest.mark.slow
def test_drain_reset_saves_before_the_job_leaves(
    coordinator: Coordinator, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    args = ["--steps", "30", "--save-every", "100", "--model", "mlp-tiny", "--step-sleep", "0.25"]
    job_id, _ = submit_train(slurm_ctl, job_dir, "run", args, nodes=3)
    node = _batch_node(slurm_ctl, job_id)
    run = job_dir / "run"
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 3 for e in events(run)), 120,
             "three training steps")  # fmt: skip
    coordinator.send(node, "xid95")  # drain-reset: the node still works, so save first

    done = wait_for(lambda: _completed(slurm_ctl, job_id), 180, "the job completed", 1.0)
    assert done.restart_count == 1
    info = slurm_ctl.node(node)
    assert info.drained
    assert info.reason == "recover: xid95 Uncontained ECC error"
    evs = events(run)
    (preempted,) = [e for e in evs if e["event"] == "preempted"]
    (restored,) = [e for e in evs if e["event"] == "restored"]
    assert preempted["signal"] == "SIGUSR1"
    assert restored["checkpoint_step"] == preempted["step"]  # 0 steps recomputed
    (completed,) = [e for e in evs if e["event"] == "completed"]
    assert completed["state_digest"] == control_digest(job_dir / "control", args)
    inc = coordinator.incident_on(node)
    assert inc is not None
    assert {"node-drained", "jobs-signalled", "jobs-saved", "spare-promoted"} <= set(phases(inc))


@pytest.mark.slow
@pytest.mark.parametrize("journal_dsn", ["sqlite", "postgres"], indirect=True)
def test_killed_coordinator_restarts_and_finishes_without_repeating(
    coordinator: Coordinator, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit_loop(slurm_ctl, job_dir)
    (node,) = wait_for(lambda: running(slurm_ctl, job_id), 30, "the job running").nodes
    coordinator.send(node, "xid79")
    wait_for(lambda: coordinator.scontrol_updates(), 20, "the first Slurm update")
    coordinator.kill()  # mid-incident: the promotion may or may not have happened
    coordinator.start()
    wait_for(lambda: (i := coordinator.incident_on(node)) and i["status"] == "closed", 90,
             "the incident closed after the restart")  # fmt: skip
    assert coordinator.scontrol_updates() == [
        f"update NodeName={node} State=DOWN Reason=recover: xid79 GPU has fallen off the bus",
        "update NodeName=spare1 State=RESUME",
    ]
    assert slurm_ctl.job(job_id).restart_count == 1


@pytest.mark.slow
def test_breaker_holds_a_burst_and_reset_releases_it(
    coordinator: Coordinator, slurm_ctl: CliSlurm
) -> None:
    # The default breaker: half of a partition per 5 minutes. The partition has 3 nodes in
    # service (the spare is not counted), so one take-out passes and two are held. One
    # request: decided together, before the spare's promotion changes the partition.
    coordinator.send_together(["node1", "node2", "node3"], "xid79")

    def held_take_downs() -> set[str]:
        held = coordinator.client.get("/v1/breaker")["held"]
        return {h["action"]["node"] for h in held if h["action"]["kind"] == "down"}

    held_nodes = wait_for(lambda: len(h := held_take_downs()) == 2 and h, 20, "two held")
    assert held_nodes == {"node2", "node3"}
    # The holds are recorded with the decisions; node1's take-down follows in the same step.
    wait_for(lambda: down_node(slurm_ctl, "node1"), 20, "node1 DOWN")
    assert {n.name for n in slurm_ctl.nodes() if n.down} == {"node1"}
    shown = coordinator.cli("breaker", "status")
    assert shown.returncode == 0, shown.stderr
    assert "TRIPPED" in shown.stdout
    reset = coordinator.cli("breaker", "reset")
    assert reset.returncode == 0, reset.stderr
    wait_for(lambda: held_nodes <= {n.name for n in slurm_ctl.nodes() if n.down}, 20,
             "the held take-outs applied after the reset")  # fmt: skip
    assert coordinator.client.get("/v1/breaker")["held"] == []


@pytest.mark.slow
def test_a_crashed_slurmd_becomes_a_node_unreachable_incident(
    coordinator: Coordinator, local_cluster: LocalCluster, slurm_ctl: CliSlurm
) -> None:
    local_cluster.crash_node("node2")  # no agent event at all
    inc = wait_for(lambda: coordinator.incident_on("node2"), 4 * SLURMD_TIMEOUT_S + 10,
                   "an incident from Slurm's own view")  # fmt: skip
    assert inc["fault"] == "node-unreachable"
    wait_for(lambda: slurm_ctl.node("spare1").in_service, 20, "the spare promoted")
    wait_for(lambda: slurm_ctl.node("node2").reason_is_ours, 20, "our mark on node2")
    assert slurm_ctl.node("node2").down
    local_cluster.restart_node("node2")
    # Our mark keeps the node out even though its slurmd registers again (ReturnToService=1).
    wait_for(lambda: "NOT_RESPONDING" not in slurm_ctl.node("node2").flags, 30, "slurmd back")
    assert slurm_ctl.node("node2").down
    status = coordinator.cli("status")
    assert status.returncode == 0, status.stderr
    assert "node2" in status.stdout
    assert "recover" in status.stdout
