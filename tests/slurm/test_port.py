"""Validation, reason marks and error classification: pure, no daemons."""

from __future__ import annotations

import pytest

from recovery.errors import (
    ReasonNotOursError,
    SlurmRefusedError,
    SlurmUnavailableError,
    UsageError,
)
from recovery.ports.slurm import (
    JobInfo,
    NodeInfo,
    describe_state,
    is_ours,
    is_slurms_own,
    mark,
    ours,
    validate_job_id,
    validate_node_name,
)
from slurm.cli_slurm import classify_failure, classify_reply_errors
from slurm.control import requeue_needed, resume_needed, take_out_plan, take_out_reason

DRAIN = frozenset({"DRAIN"})
NONE: frozenset[str] = frozenset()
LOST = frozenset({"NOT_RESPONDING", "DRAIN"})


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
    assert ours is is_ours  # the first name of the one predicate


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("recover: spare", True),
        ("recover:xid79", True),
        ("  recover: padded", True),
        ("", False),
        ("   ", False),
        ("Not responding", False),  # Slurm's own, yet not ours: we never undo it
        ("maintenance (recover: later)", False),
        ("Recover: capital", False),
    ],
)
def test_is_ours(reason: str, expected: bool) -> None:
    assert is_ours(reason) is expected
    assert NodeInfo("n", "IDLE", DRAIN, reason).reason_is_ours is expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("", True), ("  ", True), ("Not responding", True), ("Low RealMemory", False), ("rma", False)],
)
def test_is_slurms_own(reason: str, expected: bool) -> None:
    assert is_slurms_own(reason) is expected
    assert not is_ours(reason)


@pytest.mark.parametrize(
    ("state", "flags", "reason", "out", "by_other"),
    [
        ("IDLE", NONE, "", False, False),
        ("IDLE", NONE, "stale note", False, False),  # a reason alone holds nothing
        ("IDLE", frozenset({"NOT_RESPONDING"}), "", False, False),
        ("IDLE", DRAIN, "recover: xid79", True, False),
        ("IDLE", DRAIN, "bios update (alice)", True, True),
        ("IDLE", DRAIN, "", True, False),  # empty: Slurm's doing, not another owner's
        ("ALLOCATED", DRAIN, "rma", True, True),
        ("DOWN", NONE, "recover: xid48", True, False),
        # A silent slurmd: Slurm's own mark (real 22.05: reason "Not responding", set by root).
        ("DOWN", frozenset({"NOT_RESPONDING"}), "Not responding", True, False),
        ("DOWN", NONE, "Kill task failed", True, True),  # Slurm asking for a person: theirs
        ("DOWN", NONE, "", True, False),
        ("DOWN", NONE, "  ", True, False),
        ("DOWN", DRAIN, "recover: spare", True, False),
    ],
)
def test_held_by_other(
    state: str, flags: frozenset[str], reason: str, out: bool, by_other: bool
) -> None:
    node = NodeInfo("n", state, flags, reason)
    assert node.out_of_service is out
    assert node.held_by_other is by_other


@pytest.mark.parametrize(
    ("node", "text"),
    [
        (None, "missing"),
        (NodeInfo("n", "DOWN", frozenset({"DRAIN"})), "DOWN+DRAIN"),
        (NodeInfo("n", "IDLE"), "IDLE"),
        (NodeInfo("n", "IDLE", LOST), "IDLE+DRAIN+NOT_RESPONDING"),
    ],
)
def test_describe_state(node: NodeInfo | None, text: str) -> None:
    assert describe_state(node) == text


OURS = "recover: xid79"


@pytest.mark.parametrize(
    ("node", "state", "write"),
    [
        (NodeInfo("n", "IDLE"), "DOWN", OURS),
        (NodeInfo("n", "IDLE"), "DRAIN", OURS),
        (NodeInfo("n", "DOWN", NONE, OURS), "DOWN", None),  # holds already
        (NodeInfo("n", "IDLE", DRAIN, OURS), "DRAIN", None),
        (NodeInfo("n", "DOWN", NONE, "recover: other"), "DOWN", OURS),  # ours, new reason
        (NodeInfo("n", "DOWN", NONE, OURS), "DRAIN", OURS),  # DOWN+DRAIN
        (NodeInfo("n", "DOWN", NONE, ""), "DOWN", OURS),  # empty: we write ours over it
        (NodeInfo("n", "IDLE", DRAIN, ""), "DRAIN", OURS),
        (NodeInfo("n", "IDLE", DRAIN, ""), "DOWN", OURS),
        (NodeInfo("n", "DOWN", frozenset({"NOT_RESPONDING"}), "Not responding"), "DOWN", OURS),
        (NodeInfo("n", "IDLE", NONE, "stale note"), "DRAIN", OURS),  # in service: not held
        (NodeInfo("n", "IDLE", DRAIN, "rma"), "DRAIN", None),  # theirs: kept
        (NodeInfo("n", "DOWN", NONE, "rma"), "DOWN", None),
        (NodeInfo("n", "DOWN", NONE, "rma"), "DRAIN", None),
        (NodeInfo("n", "IDLE", DRAIN, "rma"), "DOWN", "rma"),  # DOWN, keeping their reason
    ],
)
def test_take_out_reason(node: NodeInfo, state: str, write: str | None) -> None:
    assert take_out_reason(node, state, OURS) == write


def test_take_out_plan_writes_one_request_per_reason() -> None:
    nodes = [
        NodeInfo("n3", "IDLE"),
        NodeInfo("n1", "IDLE", DRAIN, "rma"),  # theirs, drained: DOWN keeping their reason
        NodeInfo("n2", "DOWN", NONE, OURS),  # holds already
        NodeInfo("n4", "DOWN", NONE, "rma"),  # theirs, DOWN: kept
        NodeInfo("n5", "IDLE", DRAIN, "recover: other"),
        NodeInfo("n3", "IDLE"),  # named twice: once
    ]
    assert take_out_plan(nodes, "DOWN", OURS) == {"rma": ["n1"], OURS: ["n3", "n5"]}
    assert list(take_out_plan(nodes, "DOWN", OURS)) == ["rma", OURS]  # by first node's name
    assert take_out_plan(nodes, "DRAIN", OURS) == {OURS: ["n2", "n3", "n5"]}
    assert take_out_plan([NodeInfo("n2", "DOWN", NONE, OURS)], "DOWN", OURS) == {}
    assert take_out_plan([], "DRAIN", OURS) == {}


@pytest.mark.parametrize(
    ("node", "force", "needed"),
    [
        (NodeInfo("n", "IDLE"), False, False),  # in service: a no-op
        (NodeInfo("n", "IDLE", NONE, "stale note"), False, False),
        (NodeInfo("n", "IDLE", frozenset({"NOT_RESPONDING"})), False, False),
        (NodeInfo("n", "IDLE", DRAIN, OURS), False, True),
        (NodeInfo("n", "DOWN", NONE, OURS), False, True),
        (NodeInfo("n", "DOWN", DRAIN, "recover: spare"), False, True),
        (NodeInfo("n", "IDLE", DRAIN, "rma"), True, True),  # forced
        (NodeInfo("n", "DOWN", NONE, ""), True, True),
        (NodeInfo("n", "IDLE"), True, False),
    ],
)
def test_resume_needed(node: NodeInfo, force: bool, needed: bool) -> None:
    assert resume_needed(node, force=force) is needed


@pytest.mark.parametrize(
    "node",
    [
        NodeInfo("n", "IDLE", DRAIN, "rma", reason_set_by="alice"),
        NodeInfo("n", "DOWN", DRAIN, "rma", reason_set_by="alice"),  # our DOWN of their drain
        NodeInfo("n", "DOWN", NONE, "", reason_set_by="alice"),  # empty: not ours either
        NodeInfo(
            "n", "DOWN", frozenset({"NOT_RESPONDING"}), "Not responding", reason_set_by="alice"
        ),
    ],
)
def test_resume_of_a_mark_not_ours_is_refused(node: NodeInfo) -> None:
    with pytest.raises(ReasonNotOursError, match="set by alice") as refused:
        resume_needed(node)
    assert (refused.value.node, refused.value.reason) == ("n", node.reason)


@pytest.mark.parametrize(
    ("state", "nodes", "on_n1"),
    [
        ("RUNNING", ("n1", "n2"), True),
        ("COMPLETING", ("n1",), True),  # a requeue under way still uses the node
        ("SUSPENDED", ("n1",), True),
        ("RUNNING", ("n2",), False),
        ("RUNNING", ("n10",), False),  # names, not prefixes
        ("PENDING", ("n1",), False),
        ("COMPLETED", ("n1",), False),
        ("CANCELLED", ("n1",), False),
    ],
)
def test_job_uses_node(state: str, nodes: tuple[str, ...], on_n1: bool) -> None:
    assert JobInfo("1", "x", state, nodes).uses("n1") is on_n1


@pytest.mark.parametrize(
    ("state", "needed"),
    [("PENDING", False), ("RUNNING", True), ("COMPLETING", True), ("COMPLETED", True)],
)
def test_requeue_needed(state: str, needed: bool) -> None:
    assert requeue_needed(JobInfo("1", "x", state)) is needed


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
