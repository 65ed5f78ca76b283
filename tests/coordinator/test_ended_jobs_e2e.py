"""Jobs a hard fault ended, on real slurmctld/slurmd with the real coordinator and agents.

Faults are staged as DESIGN.md's failure model says: the training process dies (SIGABRT, no
save) while slurmd and the batch shell live on; the batch shell passes the status on (134).
The stand-in jobs are plain batch scripts (they write where and at which restart count they
run, and the pid of their "training" child); the first test runs real ``recover train``.

slurmctld keeps an ended job for MinJobAge (300 s): the session cluster's reset turns the
FAILED jobs these tests leave into CANCELLED ones, so that a later test's coordinator does not
take them for its fault's victims.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.contract.exits import EXIT_DO_NOT_RESTART
from recovery.ports.slurm import BatchJob, JobInfo
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from slurm.sbatch import submit_training
from tests.coordinator.helpers import Coordinator, control_digest, events, phases
from tests.helpers import RECOVER_SCRIPT
from tests.slurm.helpers import SLURMD_TIMEOUT_S, down_node, running, wait_for

pytestmark = pytest.mark.slurm

TRAIN = ["--steps", "24", "--save-every", "4", "--model", "mlp-tiny", "--step-sleep", "0.25"]

#: A requeueable stand-in: one line per start ("job restarts node start"), then a child that
#: stands for training (its pid in PIDS/JOB-RESTARTS); the shell passes the child's status on
#: and ignores USR1 (no save: the child cannot save), as a shell running real training would
#: have nothing to save after the training process died.
SCRIPT = """#!/bin/bash
trap '' USR1
export OUT={out}
export PIDS={pids}
echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}} $SLURMD_NODENAME start" >> "$OUT"
{child} &
echo $! > "$PIDS/$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"
wait $!
exit $?
"""


def submit(ctl: CliSlurm, job_dir: Path, *, child: str = "sleep 600", nodes: int = 1) -> str:
    """The stand-in job (variables written into the script: ``--export`` other than ALL
    makes slurmd load root's login environment first)."""
    (job_dir / "pids").mkdir(exist_ok=True)
    script = SCRIPT.format(out=job_dir / "out", pids=job_dir / "pids", child=child)
    return ctl.submit(
        BatchJob(
            script=script,
            options={
                "requeue": None,
                "open-mode": "append",
                "job-name": "standin",
                "nodes": str(nodes),
                "output": str(job_dir / "slurm-%j.out"),
            },
            workdir=str(job_dir),
        )
    )


def starts(job_dir: Path, job_id: str) -> list[tuple[int, str]]:
    """(restart count, node) of every start of ``job_id``, in order."""
    out = job_dir / "out"
    lines = out.read_text().split("\n") if out.exists() else []
    return [(int(p[1]), p[2]) for ln in lines if (p := ln.split())[:1] == [job_id]]


def child_pid(job_dir: Path, job_id: str, restarts: int = 0) -> int | None:
    path = job_dir / "pids" / f"{job_id}-{restarts}"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def ended(ctl: CliSlurm, job_id: str) -> JobInfo | None:
    job = ctl.job(job_id)
    return job if job.finished else None


def _ended_again(ctl: CliSlurm, job_id: str) -> JobInfo | None:
    job = ended(ctl, job_id)
    return job if job is not None and job.restart_count >= 1 else None


def closed(coordinator: Coordinator, node: str) -> dict[str, Any] | None:
    inc = coordinator.incident_on(node)
    return inc if inc is not None and inc["status"] == "closed" else None


def requeue_calls(coordinator: Coordinator) -> list[str]:
    return [ln for ln in coordinator.scontrol_changes() if ln.startswith("requeue")]


def detail(incident: dict[str, Any], name: str) -> str:
    (found,) = [p["detail"] for p in incident["phases"] if p["name"] == name]
    return str(found)


# The process dying before the event arrives is also the demo's xid79 (the agent kills it
# first); the whole tier keeps the drained-first and slurmd-crash orders below.
@pytest.mark.slow
@pytest.mark.soak
def test_the_process_dies_then_xid79_the_failed_job_is_requeued_and_resumes(
    coordinator: Coordinator, agents: dict[str, int], slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    run = job_dir / "run"
    job_id = submit_training(
        slurm_ctl,
        [RECOVER_SCRIPT, "train", "--run-dir", str(run), *TRAIN],
        sbatch_args=[f"--output={job_dir}/run-%j.out", f"--chdir={job_dir}"],
    )
    (node,) = wait_for(lambda: running(slurm_ctl, job_id), 60, "the training job running").nodes
    wait_for(lambda: any(e["event"] == "checkpoint" for e in events(run)), 180, "a checkpoint")
    (started,) = [e for e in events(run) if e["event"] == "started"]
    os.kill(int(started["pid"]), signal.SIGABRT)  # the GPU is lost: training dies, no save

    failed = wait_for(lambda: ended(slurm_ctl, job_id), 30, "the job ended")
    assert (failed.state, failed.exit_code, failed.restart_count) == ("FAILED", 134, 0)
    assert coordinator.incidents() == []  # a job failing says nothing by itself
    done = coordinator.cli("inject", "--fault", "xid79", "--node", node, "--via", "kmsg",
                           "--wait", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr

    wait_for(lambda: down_node(slurm_ctl, node), 20, f"{node} DOWN")
    final = wait_for(lambda: _ended_again(slurm_ctl, job_id), 360, "the requeued job ended", 1.0)
    assert (final.state, final.restart_count) == ("COMPLETED", 1)
    assert node not in final.nodes
    evs = events(run)
    (restored,) = [e for e in evs if e["event"] == "restored"]
    saved = [e["step"] for e in evs if e["event"] == "checkpoint" and e["pid"] == started["pid"]]
    # Resumed from its newest checkpoint (a save the abort cut short after its commit, before
    # its event, would be newer still).
    assert restored["checkpoint_step"] >= max(saved) >= 4
    (completed,) = [e for e in evs if e["event"] == "completed"]
    assert completed["state_digest"] == control_digest(job_dir / "control", TRAIN)

    inc = wait_for(lambda: closed(coordinator, node), 30, "the incident closed")
    assert inc["jobs"] == [job_id]
    assert {"node-down", "job-ended", "jobs-requeued", "job-running"} <= set(phases(inc))
    assert detail(inc, "job-ended").startswith(f"{job_id} FAILED exit 134 at ")
    assert detail(inc, "jobs-requeued").endswith("requeued by the coordinator)")
    assert requeue_calls(coordinator) == [f"requeue {job_id}"]  # once


@pytest.mark.slow
def test_drained_first_the_process_dies_a_moment_later_and_is_requeued(
    coordinator: Coordinator, agents: dict[str, int], slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit(slurm_ctl, job_dir)
    (node,) = wait_for(lambda: running(slurm_ctl, job_id), 30, "the job running").nodes
    pid = wait_for(lambda: child_pid(job_dir, job_id), 30, "the child's pid")
    done = coordinator.cli("inject", "--fault", "xid95", "--node", node, "--via", "agent",
                           "--wait", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    # drain-reset: the node is drained and the job asked (USR1) to save; it is still running
    wait_for(lambda: (i := coordinator.incident_on(node)) and "jobs-signalled" in phases(i),
             20, "the job signalled to save")  # fmt: skip
    assert slurm_ctl.node(node).drained
    assert slurm_ctl.job(job_id).state == "RUNNING"
    os.kill(pid, signal.SIGABRT)  # then the process dies before it could save

    again = wait_for(lambda: [s for s in starts(job_dir, job_id) if s[0] == 1], 60,
                     "the job started again")  # fmt: skip
    assert again[0][1] != node
    info = slurm_ctl.job(job_id)
    assert (info.state, info.restart_count) == ("RUNNING", 1)
    inc = wait_for(lambda: closed(coordinator, node), 30, "the incident closed")
    assert inc["jobs"] == [job_id]
    assert {"node-drained", "jobs-signalled", "job-ended", "jobs-requeued"} <= set(phases(inc))
    assert detail(inc, "jobs-requeued").endswith("requeued by the coordinator)")
    assert requeue_calls(coordinator) == [f"requeue {job_id}"]


@pytest.mark.slow
def test_a_job_failing_on_a_healthy_node_is_left_alone(
    coordinator: Coordinator, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit(slurm_ctl, job_dir, child="sh -c 'sleep 1; exit 1'")  # a bug of its own
    failed = wait_for(lambda: ended(slurm_ctl, job_id), 30, "the job ended")
    assert (failed.state, failed.exit_code) == ("FAILED", 1)
    # The coordinator has read Slurm several times since the job failed.
    wait_for(lambda: (coordinator.client.get("/v1/status")["seen_at"] or 0) > failed.end_time + 3,
             30, "three seconds of ticks after the failure")  # fmt: skip
    assert coordinator.incidents() == []
    assert requeue_calls(coordinator) == []
    info = slurm_ctl.job(job_id)
    assert (info.state, info.restart_count) == ("FAILED", 0)


@pytest.mark.slow
def test_a_job_exiting_with_the_do_not_restart_status_is_never_requeued(
    coordinator: Coordinator, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit(slurm_ctl, job_dir, child=f"sh -c 'sleep 1; exit {EXIT_DO_NOT_RESTART}'")
    failed = wait_for(lambda: ended(slurm_ctl, job_id), 30, "the job ended")
    assert (failed.state, failed.exit_code) == ("FAILED", EXIT_DO_NOT_RESTART)
    (node,) = failed.nodes
    coordinator.send(node, "xid79")  # its node faults a moment later

    inc = wait_for(lambda: closed(coordinator, node), 30, "the incident closed")
    assert slurm_ctl.node(node).down
    assert inc["jobs"] == [job_id]
    assert detail(inc, "requeue-refused") == (
        f"{job_id}: FAILED exit 93: exit 93 asks not to be restarted"
    )
    assert requeue_calls(coordinator) == []
    info = slurm_ctl.job(job_id)
    assert (info.state, info.restart_count) == ("FAILED", 0)


@pytest.mark.slow
def test_a_slurmd_crash_incident_names_the_job_slurm_requeued(
    coordinator: Coordinator, local_cluster: LocalCluster, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit(slurm_ctl, job_dir, nodes=2)
    job = wait_for(lambda: running(slurm_ctl, job_id), 30, "the 2-node job running")
    lost = job.nodes[1]  # not the batch host: the job lives on on its other node
    # The coordinator saw it there (a tick read the job running on both nodes).
    seen_running = time.time()
    wait_for(lambda: (coordinator.client.get("/v1/status")["seen_at"] or 0) > seen_running,
             10, "a tick after the job started")  # fmt: skip
    info = local_cluster.info()
    assert info is not None
    os.kill(info.pids[f"slurmd:{lost}"], signal.SIGKILL)  # slurmd crashes; nothing else

    inc = wait_for(lambda: closed(coordinator, lost), 6 * SLURMD_TIMEOUT_S + 60,
                   "the incident closed", 1.0)  # fmt: skip
    assert inc["fault"] == "node-unreachable"
    assert inc["jobs"] == [job_id]
    assert {"node-down", "jobs-requeued", "job-running"} <= set(phases(inc))
    assert requeue_calls(coordinator) == []  # Slurm requeued it: not ours to repeat
    again = slurm_ctl.job(job_id)
    assert (again.state, again.restart_count) == ("RUNNING", 1)
    assert lost not in again.nodes
    assert f"{job_id}@" in detail(inc, "job-running")
