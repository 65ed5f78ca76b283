"""Validation, reason marks and error classification: pure, no daemons."""

from __future__ import annotations

import pytest

from recovery.errors import SlurmRefusedError, SlurmUnavailableError, UsageError
from recovery.ports.slurm import JobInfo, NodeInfo, mark, ours, validate_job_id, validate_node_name
from slurm.cli_slurm import classify_failure, classify_reply_errors


@pytest.mark.parametrize("name", ["node1", "spare1", "gpu-a100.rack3_n07", "n"])
def test_valid_node_names(name: str) -> None:
    assert validate_node_name(name) == name


@pytest.mark.parametrize("name", ["", "1node", "node 1", "node1;rm -rf /", "node[1-3]", "-N"])
def test_invalid_node_names_say_what_is_valid(name: str) -> None:
    with pytest.raises(UsageError, match="expected a letter followed by"):
        validate_node_name(name)


@pytest.mark.parametrize("job_id", ["1", "42", 42, "42_3", "7+1"])
def test_valid_job_ids(job_id: str | int) -> None:
    assert validate_job_id(job_id) == str(job_id)


@pytest.mark.parametrize("job_id", ["0", "-1", "abc", "42 43", "4_", "", "1" * 11])
def test_invalid_job_ids(job_id: str) -> None:
    with pytest.raises(UsageError, match="expected a positive integer"):
        validate_job_id(job_id)


def test_mark_adds_the_owner_prefix_once() -> None:
    assert mark("xid79 on gpu0") == "recover: xid79 on gpu0"
    assert mark("recover: xid79") == "recover: xid79"
    assert mark("  recover:spare ") == "recover: spare"
    assert ours("recover: spare")
    assert not ours("maintenance (recover: later)")


@pytest.mark.parametrize("reason", ["", "   ", "recover:", "two\nlines", 'say "hi"'])
def test_mark_rejects_reasons_slurm_would_mangle(reason: str) -> None:
    with pytest.raises(UsageError, match="Invalid reason"):
        mark(reason)


def test_node_info_service_states() -> None:
    assert NodeInfo("n1", "IDLE").in_service
    assert not NodeInfo("n1", "IDLE", frozenset({"DRAIN"})).in_service
    assert not NodeInfo("n1", "IDLE", frozenset({"NOT_RESPONDING"})).in_service
    assert not NodeInfo("n1", "DOWN").in_service
    assert JobInfo("1", "x", "COMPLETED").finished
    assert not JobInfo("1", "x", "PENDING").finished


@pytest.mark.parametrize(
    "stderr",
    [
        "slurm_load_node error: Unable to contact slurm controller (connect failure)",
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
        "error: slurm_persist_conn_open_without_init: failed to open persistent connection "
        "to host:localhost:6819: Connection refused",
    ],
)
def test_unreachable_controller_is_transient(stderr: str) -> None:
    err = classify_failure(["sinfo", "--json"], 1, stderr)
    assert isinstance(err, SlurmUnavailableError)
    assert "slurmctld unreachable" in str(err)


@pytest.mark.parametrize(
    "stderr",
    [
        "slurm_update error: Invalid node state specified",
        "scontrol: error: Invalid job id specified",
        "slurm_update error: Access/permission denied",
    ],
)
def test_refusals_are_verdicts(stderr: str) -> None:
    err = classify_failure(["scontrol", "update"], 1, stderr)
    assert isinstance(err, SlurmRefusedError)
    assert stderr in str(err)


def test_json_reply_errors_are_classified() -> None:
    unreachable = classify_reply_errors(
        ["sinfo", "--json"], [{"error": "Unspecified error", "errno": -1}]
    )
    assert isinstance(unreachable, SlurmUnavailableError)
    refused = classify_reply_errors(["squeue", "--json"], [{"error": "Invalid user", "errno": 2}])
    assert isinstance(refused, SlurmRefusedError)
    assert "Invalid user (errno 2)" in str(refused)
