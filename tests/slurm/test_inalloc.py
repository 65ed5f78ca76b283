"""Recovery inside the allocation on the real local cluster: `recover sbatch -N 2 --spares 1`
holds three nodes with --no-kill (on 22.05 and on 25.11, where it is not submitted expedited:
a job that requeues itself would be held); a
training process dies (SIGABRT, as on XID 79) and its node
is set DOWN (as the coordinator does): the job's supervisor relaunches the step on the spare,
the job is never requeued, and it ends bit-exact with the uninterrupted 2-process run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from recovery.errors import UsageError
from slurm.cli_slurm import CliSlurm
from tests.helpers import submit_train
from tests.slurm.helpers import wait_for
from tests.train import multi

pytestmark = pytest.mark.slurm

ARGS = ["--steps", "16", "--save-every", "3", "--model", "mlp-tiny", "--step-sleep", "0.3"]


def _journal(job_dir: Path, job_id: str) -> list[dict[str, Any]]:
    path = job_dir / f"supervisor-{job_id}.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _events(job_dir: Path, job_id: str, name: str) -> list[dict[str, Any]]:
    return [e for e in _journal(job_dir, job_id) if e["event"] == name]


def _control_digest(job_dir: Path) -> str:
    multi.run(job_dir / "control", 2, 16, 3, "--model", "mlp-tiny")
    return multi.final_digest(job_dir / "control", 2)


def _crash_rank1_and_down_its_node(ctl: CliSlurm, run: Path) -> str:
    """SIGABRT process 1 (no save), then set its node DOWN as the coordinator would."""
    wait_for(lambda: bool(multi.of(run, "checkpoint").get(1)), 240, "a checkpoint")
    (joined,) = multi.of(run, "joined")[1]
    (started,) = multi.of(run, "started")[1]
    victim = str(started["node"])
    os.kill(int(joined["pid"]), signal.SIGABRT)
    ctl.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=test-xid79"])
    return victim


@pytest.mark.slow  # about 100 s: three JAX launches (first step, relaunch, control)
@pytest.mark.parametrize(
    "slurm_backend", ["cli", pytest.param("cli@25.11", marks=pytest.mark.soak)]
)
def test_a_lost_node_is_replaced_by_the_jobs_spare_without_a_requeue(
    slurm_ctl: CliSlurm, job_dir: Path, slurm_backend: str
) -> None:
    job_id, run = submit_train(
        slurm_ctl, job_dir, "ia", ARGS, nodes=2, processes=2, spares=1, signal_lead_s=30
    )
    wait_for(lambda: _events(job_dir, job_id, "launched"), 120, "the supervisor's first step")
    (sup,) = _events(job_dir, job_id, "supervising")
    assert len(sup["job_nodes"]) == 3
    assert sup["batch_host"] in sup["spares"]
    # A standby process waits on every node of the job once the launch has run a while.
    wait_for(lambda: _events(job_dir, job_id, "standby"), 120, "the standbys")
    (standby,) = _events(job_dir, job_id, "standby")
    assert sorted(standby["started"]) == sorted(sup["job_nodes"])
    victim = _crash_rank1_and_down_its_node(slurm_ctl, run)
    assert victim in sup["step_nodes"]

    wait_for(lambda: _events(job_dir, job_id, "relaunch"), 60, "a relaunch")
    (relaunch,) = _events(job_dir, job_id, "relaunch")
    assert relaunch["lost"] == [victim]
    assert sorted(relaunch["step_nodes"]) == sorted(
        [n for n in sup["step_nodes"] if n != victim] + [sup["batch_host"]]
    )
    # squeue and sinfo agree: the job no longer holds the DOWN node, which stays out of service.
    job = slurm_ctl.job(job_id)
    assert victim not in job.nodes
    assert job.state == "RUNNING"
    assert slurm_ctl.node(victim).down

    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 300, "the job to complete")
    assert slurm_ctl.job(job_id).restart_count == 0  # never requeued
    launched = _events(job_dir, job_id, "launched")
    assert [e["attempt"] for e in launched] == [0, 1]
    # The relaunch handed the survivor's node and the spare their standby: none was started.
    assert sorted(launched[1]["warm"]) == sorted(relaunch["step_nodes"])
    assert _events(job_dir, job_id, "finish")[-1]["status"] == 0
    restored = multi.of(run, "restored")
    assert {e["checkpoint_step"] for r in (0, 1) for e in restored[r]}  # resumed, not restarted
    assert multi.final_digest(run, 2) == _control_digest(job_dir)


@pytest.mark.slow
def test_a_supervisor_killed_mid_relaunch_requeues_the_job_and_nothing_is_lost(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id, run = submit_train(
        slurm_ctl, job_dir, "kill", ARGS, nodes=2, processes=2, spares=1, signal_lead_s=30
    )
    wait_for(lambda: _events(job_dir, job_id, "launched"), 120, "the supervisor's first step")
    (sup,) = _events(job_dir, job_id, "supervising")
    _crash_rank1_and_down_its_node(slurm_ctl, run)
    wait_for(lambda: _events(job_dir, job_id, "relaunch"), 60, "a relaunch")
    os.kill(int(sup["pid"]), signal.SIGKILL)

    wait_for(lambda: slurm_ctl.job(job_id).restart_count >= 1, 60, "the job to be requeued")
    out = job_dir / f"kill-{job_id}.out"
    wait_for(lambda: "no decision; requeueing" in out.read_text(), 30, "the script's requeue")
    # The requeued job needs 3 nodes in service again: the DOWN one comes back, as after a repair.
    for node in slurm_ctl.nodes():
        if node.down:
            slurm_ctl.resume(node.name, force=True)
    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 400, "the requeued job to end")
    assert multi.final_digest(run, 2) == _control_digest(job_dir)


@pytest.mark.slow  # about 80 s: three launches of one process, and its control
@pytest.mark.soak
def test_a_second_fault_during_the_relaunch_takes_the_next_spare(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    """One process and two spares in the job: the process dies and its node goes DOWN; the
    moment the supervisor relaunches on the first spare, that node goes DOWN too (a second
    fault while the relaunch starts). The supervisor relaunches again on the last spare (the
    batch host): the job completes, never requeued, both bad nodes out of the job and out of
    service, and the final state is the uninterrupted run's."""
    job_id, run = submit_train(
        slurm_ctl, job_dir, "second", ARGS, nodes=1, spares=2, signal_lead_s=30
    )
    wait_for(lambda: _events(job_dir, job_id, "launched"), 120, "the supervisor's first step")
    (sup,) = _events(job_dir, job_id, "supervising")
    (first,) = sup["step_nodes"]
    wait_for(lambda: bool(multi.of(run, "checkpoint").get(0)), 240, "a checkpoint")
    (started,) = multi.of(run, "started")[0]
    os.kill(int(started["pid"]), signal.SIGABRT)
    slurm_ctl.run(["scontrol", "update", f"NodeName={first}", "State=DOWN", "Reason=test-1st"])

    wait_for(lambda: len(_events(job_dir, job_id, "launched")) >= 2, 60, "the relaunch")
    (second,) = _events(job_dir, job_id, "launched")[1]["nodes"]
    slurm_ctl.run(["scontrol", "update", f"NodeName={second}", "State=DOWN", "Reason=test-2nd"])

    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 300, "the job to complete")
    assert slurm_ctl.job(job_id).restart_count == 0  # never requeued
    relaunches = _events(job_dir, job_id, "relaunch")
    assert [r["lost"] for r in relaunches] == [[first], [second]]
    launched = _events(job_dir, job_id, "launched")
    assert [e["nodes"] for e in launched] == [[first], [second], [sup["batch_host"]]]
    assert _events(job_dir, job_id, "finish")[-1]["status"] == 0
    assert all(slurm_ctl.node(n).down for n in (first, second))
    control = job_dir / "control1"
    multi.run(control, 1, 16, 3, "--model", "mlp-tiny")
    assert multi.final_digest(run, 1) == multi.final_digest(control, 1)


def test_more_spares_than_the_cluster_holds_is_refused_naming_what_fits(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    with pytest.raises(UsageError, match=r"asks 7 nodes .* 3 in service .*at most --spares 1"):
        submit_train(
            slurm_ctl, job_dir, "big", ARGS, nodes=2, processes=2, spares=5, signal_lead_s=30
        )
    assert not [j for j in slurm_ctl.jobs() if not j.finished]
