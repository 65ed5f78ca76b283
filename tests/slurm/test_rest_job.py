"""sbatch options as slurmrestd 22.05's job submission (slurm/rest_job.py): pure, no daemons.
The names and switch values were checked against the real daemon (samples/rest-22.05/)."""

from __future__ import annotations

import pytest

from recovery.errors import SlurmUnsupportedError, UsageError
from recovery.ports.slurm import BatchJob
from slurm.rest_job import job_environment, job_request
from slurm.sbatch import training_job

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root", "SLURM_JWT": "secret"}


def test_options_take_slurmrestds_names_and_switches_its_values() -> None:
    job = BatchJob(
        script="#!/bin/bash\ntrue\n",
        options={
            "job-name": "loop",
            "requeue": None,
            "open-mode": "append",
            "output": "/jobs/%j.out",
            "time": "10:00",
            "exclusive": None,
            "signal": "USR1@60",
        },
        extra_args=["--partition=main", "--exclude=node3", "--hold"],
        workdir="/jobs",
    )
    body = job_request(job, ENV)
    assert body["script"] == job.script
    assert body["job"] == {
        "name": "loop",
        "requeue": True,
        "open_mode": "append",
        "standard_output": "/jobs/%j.out",
        "time_limit": "10:00",
        "exclusive": "exclusive",
        "signal": "USR1@60",
        "partition": "main",
        "exclude_nodes": "node3",
        "hold": True,
        "current_working_directory": "/jobs",
        "environment": {"PATH": "/usr/bin:/bin", "HOME": "/root"},  # never the JWT
    }


@pytest.mark.parametrize(
    ("export", "expected"),
    [
        (None, {"PATH": "/usr/bin:/bin", "HOME": "/root"}),  # sbatch's default: ALL
        ("ALL,OUT=/jobs/out", {"PATH": "/usr/bin:/bin", "HOME": "/root", "OUT": "/jobs/out"}),
        ("HOME,OUT=x", {"HOME": "/root", "OUT": "x"}),
        ("NONE", {"SLURM_EXPORT_ENV": "NONE"}),
        ("SLURM_JWT", {"SLURM_EXPORT_ENV": "NONE"}),  # nothing left: never empty
    ],
)
def test_export_becomes_the_jobs_environment(export: str | None, expected: dict[str, str]) -> None:
    assert job_environment(export, ENV) == expected


def test_a_malformed_export_entry_says_what_is_valid() -> None:
    with pytest.raises(UsageError, match="expected ALL, NONE, NAME or NAME=value"):
        job_environment("ALL,1BAD=x", ENV)


def test_unknown_options_name_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"Unknown sbatch option for slurmrestd 'wrap'\. Known: "):
        job_request(BatchJob(script="x", options={"wrap": "hostname"}), ENV)
    with pytest.raises(UsageError, match="give long options as --name=value"):
        job_request(BatchJob(script="x", extra_args=["-N", "2"]), ENV)
    with pytest.raises(UsageError, match="--partition needs a value"):
        job_request(BatchJob(script="x", options={"partition": None}), ENV)


def test_a_signal_for_the_batch_shell_only_is_refused_not_approximated() -> None:
    # recover sbatch asks for USR1 to the batch shell before the time limit (B:USR1@N),
    # which slurmrestd 22.05 answers "Invalid SIGNAL specification".
    job = training_job(["recover", "train", "--run-dir", "/runs/x"], workdir="/runs")
    with pytest.raises(SlurmUnsupportedError, match="batch shell only"):
        job_request(job, ENV)
