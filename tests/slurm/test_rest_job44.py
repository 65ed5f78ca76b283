"""sbatch options as slurmrestd v0.0.44's typed job fields (Slurm 25.11): pure."""

from __future__ import annotations

import pytest

from recovery.errors import UsageError
from recovery.ports.slurm import BatchJob
from slurm.rest_job44 import job_request44, minutes
from slurm.sbatch import training_job
from tests.slurm.helpers import TRAIN


@pytest.mark.parametrize(
    ("text", "mins"),
    [("5", 5), ("1:30", 2), ("2:00:00", 120), ("1-0", 1440), ("1-2:30", 1590), ("0-0:0:59", 1)],
)
def test_time_limits_in_sbatchs_forms_become_minutes(text: str, mins: int) -> None:
    assert minutes(text) == mins


def test_a_time_in_no_known_form_names_the_forms() -> None:
    with pytest.raises(UsageError, match="expected MM, MM:SS, HH:MM:SS"):
        minutes("an hour")


def test_the_training_job_keeps_its_batch_signal_and_expedited_requeue() -> None:
    job = training_job(TRAIN, sbatch_args=["--time=1:00:00"], expedite=True, workdir="/w")
    body = job_request44(job, {"PATH": "/usr/bin", "SLURM_JWT": "secret", "HOME": "/root"})
    props = body["job"]
    assert props["requeue"] is True
    assert props["flags"] == ["EXPEDITED_REQUEUE"]
    assert props["open_mode"] == ["APPEND"]
    assert (props["kill_warning_signal"], props["kill_warning_delay"]) == ("USR1", 60)
    assert props["kill_warning_flags"] == ["BATCH_JOB"]  # the batch shell only
    assert props["time_limit"] == 60
    assert props["name"] == "recover-train"
    assert props["current_working_directory"] == "/w"
    # The JWT is a credential, never the job's: the rest is exported as NAME=value.
    assert sorted(props["environment"]) == ["HOME=/root", "PATH=/usr/bin"]
    assert body["script"] == job.script


def test_plain_requeue_and_node_lists() -> None:
    job = BatchJob(
        "#!/bin/sh\n",
        options={"requeue": None, "nodelist": "node1,node2", "exclude": "node3", "ntasks": "2"},
    )
    props = job_request44(job, {})["job"]
    assert props["requeue"] is True
    assert "flags" not in props
    assert props["required_nodes"] == ["node1", "node2"]
    assert props["excluded_nodes"] == ["node3"]
    assert props["tasks"] == 2


def test_options_it_cannot_translate_are_refused_by_name() -> None:
    with pytest.raises(UsageError, match=r"Unknown sbatch option for slurmrestd v0\.0\.44 'gres'"):
        job_request44(BatchJob("#!/bin/sh\n", options={"gres": "gpu:1"}), {})
    with pytest.raises(UsageError, match="expected --requeue or --requeue=expedite"):
        job_request44(BatchJob("#!/bin/sh\n", options={"requeue": "always"}), {})
    with pytest.raises(UsageError, match="takes a whole number"):
        job_request44(BatchJob("#!/bin/sh\n", options={"ntasks": "two"}), {})
