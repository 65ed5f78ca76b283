"""The Flax example under ``recover sbatch`` on the real local Slurm cluster: Slurm's USR1
ahead of the time limit makes it save and exit with 75, the batch script requeues the job,
and the requeued run resumes and ends with the uninterrupted run's digest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.examples.conftest import STEPS, command, events, wait_for_event
from tests.helpers import RECOVER_SCRIPT
from tests.slurm.helpers import wait_for

# Slow: the control run, then a job that is requeued once (minutes on a loaded machine).
# The whole tier runs the example under Slurm as a scenario (tests/scenarios/test_command_job.py).
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.soak]


def test_recover_sbatch_requeues_and_resumes_the_example_bit_exact(
    slurm_cluster: LocalCluster,
    slurm_ctl: CliSlurm,
    job_dir: Path,
    example_env: dict[str, str],
    control_digest: str,
) -> None:
    run_dir = job_dir / "lm"
    submitted = subprocess.run(
        [
            RECOVER_SCRIPT, "sbatch", "--slurm-conf", str(slurm_cluster.conf_path),
            f"--output={job_dir}/lm-%j.out", f"--chdir={job_dir}",
            "--", *command(run_dir, "--step-delay", "0.2"),
        ],
        env=example_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    wait_for_event(run_dir, "step", 5)
    # What Slurm does before the time limit: USR1 to the batch shell, which forwards it.
    slurm_ctl.run(["scancel", "--batch", "--signal=USR1", job_id])
    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 900, "job completed")
    assert slurm_ctl.job(job_id).restart_count == 1

    (preempted,) = events(run_dir, "preempted")
    assert preempted["signal"] == "SIGUSR1"
    assert preempted["restart_count"] == 0
    (restored,) = events(run_dir, "restored")
    assert restored["restart_count"] == 1
    assert restored["step"] == preempted["step"]  # nothing recomputed
    (completed,) = events(run_dir, "completed")
    assert completed["slurm_job_id"] == job_id
    assert completed["step"] == STEPS
    assert completed["state_digest"] == control_digest
    out = (job_dir / f"lm-{job_id}.out").read_text()
    assert f"job {job_id} saved and stopped on USR1; requeueing" in out
