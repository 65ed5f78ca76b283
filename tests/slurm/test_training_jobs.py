"""Training under Slurm through the sbatch wrapper: USR1 -> save -> requeue -> resume, and a
node set DOWN under a real `recover train` job that still ends bit-for-bit as if undisturbed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from slurm.cli_slurm import CliSlurm
from slurm.sbatch import submit_training
from tests.helpers import RECOVER_SCRIPT, submit_train
from tests.slurm.helpers import running, wait_for
from tests.train import multi

pytestmark = pytest.mark.slurm


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _reference_digest(run_dir: Path, args: list[str]) -> str:
    """Final state digest of the same training run, undisturbed and outside Slurm."""
    done = subprocess.run(
        [RECOVER_SCRIPT, "train", "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (completed,) = [e for e in _events(run_dir) if e["event"] == "completed"]
    return str(completed["state_digest"])


# The whole tier has the two-process version of this (below); this one soaks.
@pytest.mark.slow
@pytest.mark.soak
def test_usr1_saves_requeues_and_the_job_resumes_bit_exact(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    args = ["--steps", "20", "--save-every", "100", "--model", "mlp-tiny", "--step-sleep", "0.3"]
    run = job_dir / "usr1"
    job_id = submit_training(
        slurm_ctl,
        [RECOVER_SCRIPT, "train", "--run-dir", str(run), *args],
        sbatch_args=[f"--output={job_dir}/usr1-%j.out", f"--chdir={job_dir}"],
        signal_lead_s=30,
    )
    wait_for(
        lambda: any(e["event"] == "step" and e["step"] >= 3 for e in _events(run)),
        90,
        "three training steps",
    )
    # What Slurm does signal_lead_s before the time limit: USR1 to the batch shell only;
    # the wrapper forwards it to training, which saves, exits 75, and the job is requeued.
    slurm_ctl.run(["scancel", "--batch", "--signal=USR1", job_id])
    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 120, "job completed")
    assert slurm_ctl.job(job_id).restart_count == 1

    events = _events(run)
    (preempted,) = [e for e in events if e["event"] == "preempted"]
    assert preempted["signal"] == "SIGUSR1"
    assert preempted["restart_count"] == 0
    (restored,) = [e for e in events if e["event"] == "restored"]
    assert restored["restart_count"] == 1
    assert restored["checkpoint_step"] == preempted["step"]  # nothing recomputed
    (completed,) = [e for e in events if e["event"] == "completed"]
    assert completed["slurm_job_id"] == job_id
    assert completed["state_digest"] == _reference_digest(job_dir / "usr1-ref", args)
    out = (job_dir / f"usr1-{job_id}.out").read_text()
    assert f"job {job_id} saved and stopped on USR1; requeueing" in out  # append mode kept it


# Soak tier: the whole tier still sees a job requeued off a DOWN node and resumed bit exact,
# through the coordinator (`recover demo`, the slurmd-crash scenario).
@pytest.mark.slow
@pytest.mark.soak
def test_down_node_training_resumes_and_matches_an_undisturbed_run(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    args = ["--steps", "30", "--save-every", "5", "--model", "mlp-tiny", "--step-sleep", "0.3"]
    reference, victim = job_dir / "reference", job_dir / "victim"
    ids = {
        run: submit_training(
            slurm_ctl,
            [RECOVER_SCRIPT, "train", "--run-dir", str(run), *args],
            sbatch_args=[f"--output={job_dir}/{run.name}-%j.out", f"--chdir={job_dir}"],
        )
        for run in (reference, victim)
    }
    # Take the victim's node down once it saved a checkpoint mid-run.
    wait_for(
        lambda: any(e["event"] == "checkpoint" and e["step"] >= 5 for e in _events(victim)),
        90,
        "victim's first checkpoint",
    )
    first = running(slurm_ctl, ids[victim])
    assert first is not None
    assert slurm_ctl.down(first.nodes[0], "xid79 test") is True

    def done() -> bool:
        return all(slurm_ctl.job(i).state == "COMPLETED" for i in ids.values())

    wait_for(done, 150, "both training jobs completed", interval_s=1)
    assert slurm_ctl.job(ids[victim]).restart_count == 1
    assert slurm_ctl.job(ids[reference]).restart_count == 0

    events = _events(victim)
    starts = [e for e in events if e["event"] == "started"]
    assert [e.get("restart_count") for e in starts] == [0, 1]
    assert {e.get("slurm_job_id") for e in starts} == {ids[victim]}
    restored = [e for e in events if e["event"] == "restored"]
    assert len(restored) == 1
    assert restored[0]["step"] >= 5
    (ref_done,) = [e for e in _events(reference) if e["event"] == "completed"]
    (victim_done,) = [e for e in events if e["event"] == "completed"]
    assert victim_done["step"] == ref_done["step"] == 30
    assert victim_done["state_digest"] == ref_done["state_digest"]


# --- several processes, one per node -----------------------------------------------------------


@pytest.mark.slow
def test_two_processes_usr1_all_save_one_step_requeue_and_resume_bit_exact(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    """`recover sbatch -N 2`: two processes on two nodes under srun. USR1 to the batch shell
    reaches both through srun; they save the same step, exit 75, the job requeues itself
    and both resume from that step, ending as the uninterrupted 2-process run does."""
    args = ["--steps", "12", "--save-every", "100", "--model", "mlp-tiny", "--step-sleep", "0.3"]
    job_id, run = submit_train(
        slurm_ctl, job_dir, "k2", args, nodes=2, processes=2, signal_lead_s=30
    )
    wait_for(lambda: len(multi.of(run, "step").get(1, [])) >= 2, 240, "two steps on process 1")
    slurm_ctl.run(["scancel", "--batch", "--signal=USR1", job_id])
    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 240, "job completed")
    assert slurm_ctl.job(job_id).restart_count == 1

    pre, restored = multi.of(run, "preempted"), multi.of(run, "restored")
    assert [[e["step"] for e in pre[r]] for r in (0, 1)] == [[pre[0][0]["step"]]] * 2
    assert {e["restart_count"] for r in (0, 1) for e in pre[r]} == {0}
    assert [[e["checkpoint_step"] for e in restored[r]] for r in (0, 1)] == [
        [pre[0][0]["step"]]
    ] * 2  # nothing recomputed
    started = multi.of(run, "started")
    assert {started[0][0]["node"], started[1][0]["node"]} == {"node1", "node2"}
    digest = multi.final_digest(run, 2)
    multi.run(job_dir / "control", 2, 12, 100, "--model", "mlp-tiny")
    assert digest == multi.final_digest(job_dir / "control", 2)
    out = (job_dir / f"k2-{job_id}.out").read_text()
    assert f"job {job_id} saved and stopped on USR1; requeueing" in out


@pytest.mark.slow
def test_a_process_killed_stops_the_others_and_a_requeue_resumes_bit_exact(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    """SIGABRT of process 1 of 3 (a process on a lost GPU): processes 0 and 2 stop by
    themselves (exit 76) and say so; srun ends the step with the dead process's status and
    the job is FAILED (its requeue is the coordinator's: issue 14, section 4). Requeued by
    hand, it resumes from an intact step and ends as the uninterrupted 3-process run."""
    args = ["--steps", "20", "--save-every", "3", "--model", "mlp-tiny-48", "--step-sleep", "0.3"]
    job_id, run = submit_train(
        slurm_ctl, job_dir, "k3", args, nodes=3, processes=3, signal_lead_s=30
    )
    wait_for(lambda: bool(multi.of(run, "checkpoint").get(1)), 240, "a checkpoint")
    (joined,) = multi.of(run, "joined")[1]
    killed_at = time.time()
    os.kill(int(joined["pid"]), signal.SIGABRT)
    wait_for(lambda: slurm_ctl.job(job_id).finished, 60, "the job to end")
    job = slurm_ctl.job(job_id)
    assert job.state == "FAILED"
    lost = multi.of(run, "peer-lost")
    assert sorted(r for r, evs in lost.items() if evs) == [0, 2]
    for r in (0, 2):
        (e,) = lost[r]
        assert (e["lost_rank"], e["exit_code"]) == (1, 76)
        assert e["heard_unix"] >= killed_at

    slurm_ctl.run(["scontrol", "requeue", job_id])
    wait_for(
        lambda: slurm_ctl.job(job_id).state == "COMPLETED", 300, "the requeued job to complete"
    )
    assert not any(multi.of(run, "fallback").values())
    multi.run(job_dir / "control", 3, 20, 3, "--model", "mlp-tiny-48")
    assert multi.final_digest(run, 3) == multi.final_digest(job_dir / "control", 3)


@pytest.mark.slow
def test_without_requeue_a_preempted_job_keeps_its_checkpoint_and_says_how_to_resume(
    slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    args = ["--steps", "12", "--save-every", "100", "--model", "mlp-tiny", "--step-sleep", "0.3"]
    job_id, run = submit_train(
        slurm_ctl,
        job_dir,
        "noq",
        args,
        nodes=2,
        processes=2,
        signal_lead_s=30,
        sbatch=("--no-requeue",),
    )
    wait_for(lambda: len(multi.of(run, "step").get(0, [])) >= 2, 240, "two steps")
    slurm_ctl.run(["scancel", "--batch", "--signal=USR1", job_id])
    wait_for(lambda: slurm_ctl.job(job_id).finished, 120, "the job to end")
    assert slurm_ctl.job(job_id).restart_count == 0
    (pre,) = multi.of(run, "preempted")[0]
    out = (job_dir / f"noq-{job_id}.out").read_text()
    assert "cannot be requeued (--no-requeue?)" in out
    assert "submit the same command to resume" in out
    again, _ = submit_train(slurm_ctl, job_dir, "noq", args, nodes=2, processes=2, signal_lead_s=30)
    wait_for(lambda: slurm_ctl.job(again).state == "COMPLETED", 240, "the resubmitted job")
    (restored,) = multi.of(run, "restored")[0]
    assert restored["checkpoint_step"] == pre["step"]
