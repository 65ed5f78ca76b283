"""The mark recover sbatch leaves in a job's comment (recovery/contract/jobmark.py)."""

from __future__ import annotations

import pytest

from recovery.contract.jobmark import (
    PROGRESS_FAULTS,
    in_allocation,
    is_ours,
    job_comment,
    left_to_supervisor,
)
from slurm.sbatch import training_job


def test_the_marks_read_back() -> None:
    assert is_ours(job_comment(in_allocation=False))
    assert not in_allocation(job_comment(in_allocation=False))
    assert in_allocation(job_comment(in_allocation=True))


@pytest.mark.parametrize("comment", ["", "my own note", "recover:trainer", "recover:", "train"])
def test_other_comments_are_not_ours(comment: str) -> None:
    assert not is_ours(comment)
    assert not in_allocation(comment)


@pytest.mark.parametrize("fault", sorted(PROGRESS_FAULTS))
def test_only_progress_faults_of_supervised_jobs_are_left_to_them(fault: str) -> None:
    assert left_to_supervisor(job_comment(in_allocation=True), fault)
    assert not left_to_supervisor(job_comment(in_allocation=False), fault)
    assert not left_to_supervisor(job_comment(in_allocation=True), "xid79")
    assert not left_to_supervisor(job_comment(in_allocation=True), "xid94")


def test_recover_sbatch_marks_its_training_jobs_and_a_users_comment_wins() -> None:
    train = ["recover", "train", "--run-dir", "r", "--steps", "3", "--save-every", "1"]
    plain = training_job(train, processes=2)
    assert plain.options["comment"] == "recover:train"
    spares = training_job(train, processes=2, spares=1)
    assert spares.options["comment"] == "recover:train,in-allocation"
    named = training_job(train, job_name="mine")
    assert named.options["comment"] == "recover:train"  # the name changes, never the mark
    theirs = training_job(train, sbatch_args=["--comment=theirs"])
    assert theirs.extra_args[-1] == "--comment=theirs"  # after ours on sbatch's line: it wins
    other = training_job(["python3", "mine.py"])
    assert "comment" not in other.options  # not our trainer: not marked
