"""Parsers of Slurm's JSON, on literal output: real 22.05 captures and hand-written 23.11."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.errors import SlurmError
from slurm.parse import (
    expand_hostlist,
    job_state,
    job_state_word,
    number,
    parse_jobs,
    parse_nodes,
    split_state,
)

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_sinfo_22_05_real_capture() -> None:
    nodes = {n.name: n for n in parse_nodes(sample("sinfo-22.05.json"))}
    assert list(nodes) == ["node1", "node2", "node3", "spare1"]
    assert (nodes["node1"].state, nodes["node1"].flags, nodes["node1"].reason) == (
        "IDLE", frozenset(), "")  # fmt: skip
    assert nodes["node1"].reason_set_by == ""  # null in the capture
    assert nodes["node2"].state == "ALLOCATED"
    assert nodes["node2"].flags == {"DRAIN"}
    assert nodes["node2"].reason == "recover: xid79 gpu fell off the bus"
    assert nodes["node2"].reason_is_ours
    assert not nodes["node2"].in_service
    assert nodes["node3"].down
    assert not nodes["node3"].reason_is_ours
    assert nodes["node3"].reason_set_by == "root"
    assert nodes["spare1"].drained
    assert nodes["spare1"].state == "IDLE"
    assert nodes["spare1"].cpus == 1
    assert nodes["spare1"].partitions == ("main",)


def test_sinfo_23_11_list_states_and_wrapped_numbers() -> None:
    nodes = {n.name: n for n in parse_nodes(sample("sinfo-23.11.json"))}
    assert nodes["node1"].in_service
    assert nodes["node1"].state == "IDLE"
    assert (nodes["node2"].state, nodes["node2"].flags) == ("ALLOCATED", frozenset({"DRAIN"}))
    assert nodes["node2"].cpus == 1  # {"set": true, "number": 1}
    assert (nodes["node3"].state, nodes["node3"].flags) == ("DOWN", frozenset({"NOT_RESPONDING"}))
    assert nodes["spare1"].drained
    assert nodes["spare1"].reason == "recover: spare"
    assert nodes["node3"].partitions == ("main", "debug")


def test_squeue_22_05_real_capture() -> None:
    jobs = {j.job_id: j for j in parse_jobs(sample("squeue-22.05.json"))}
    assert list(jobs) == ["1", "2", "3"]
    assert (jobs["1"].state, jobs["1"].nodes, jobs["1"].restart_count) == (
        "RUNNING", ("node2",), 1)  # fmt: skip
    assert jobs["2"].nodes == ("node1", "node3")  # "node[1,3]"
    assert (jobs["3"].state, jobs["3"].nodes, jobs["3"].reason) == ("PENDING", (), "Resources")
    assert jobs["1"].name == "loop"
    assert "JOB_WAS_RUNNING" in jobs["1"].flags
    # Where the batch script runs: the first node of job 2's allocation; none while pending.
    assert [jobs[i].batch_host for i in ("1", "2", "3")] == ["node2", "node1", ""]


def test_squeue_23_11_list_states_and_wrapped_numbers() -> None:
    jobs = {j.job_id: j for j in parse_jobs(sample("squeue-23.11.json"))}
    assert (jobs["7"].state, jobs["7"].exit_code, jobs["7"].restart_count) == ("RUNNING", 0, 0)
    assert jobs["8"].state == "PENDING"
    assert "REQUEUED" in jobs["8"].flags
    assert jobs["8"].restart_count == 2
    assert jobs["8"].exit_code is None
    assert jobs["9"].nodes == ("node1", "node3", "node4", "spare1")
    assert jobs["9"].finished
    assert jobs["9"].exit_code == 3


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node1", ("node1",)),
        ("node[1-3]", ("node1", "node2", "node3")),
        ("node[1,3-4],spare1", ("node1", "node3", "node4", "spare1")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("gpu[1-2]-a", ("gpu1-a", "gpu2-a")),
        ("", ()),
    ],
)
def test_expand_hostlist(text: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("bad", ["node[1-", "node[a]", "node[1]x[2]"])
def test_expand_hostlist_rejects_malformed(bad: str) -> None:
    with pytest.raises(SlurmError, match="cannot parse hostlist"):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3),
        ({"set": True, "infinite": False, "number": 3}, 3),
        ({"set": False, "infinite": False, "number": 3}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        ("12", 12),
        (True, None),
        (None, None),
    ],
)
def test_number_unwraps_both_shapes(value: object, expected: int | None) -> None:
    assert number(value, None) == expected


def test_split_state_shapes() -> None:
    assert split_state("idle", ["DRAIN"]) == ("IDLE", frozenset({"DRAIN"}))
    assert split_state("down+drain") == ("DOWN", frozenset({"DRAIN"}))
    assert split_state(["DRAIN", "MIXED"]) == ("MIXED", frozenset({"DRAIN"}))
    with pytest.raises(SlurmError, match="unexpected state"):
        split_state(7)


def test_parse_errors_name_what_was_expected() -> None:
    with pytest.raises(SlurmError, match="did not print JSON"):
        parse_nodes("sinfo: error: something")
    with pytest.raises(SlurmError, match="no 'jobs' list"):
        parse_jobs(json.dumps({"nodes": []}))
    with pytest.raises(SlurmError, match="reported errors"):
        parse_nodes(json.dumps({"nodes": [], "errors": [{"error": "boom"}]}))


# --- Slurm 25.11: real captures (scontrol show nodes --json, squeue --json --states=all) ----


def test_scontrol_nodes_25_11_keeps_a_reason_only_while_the_node_is_out() -> None:
    nodes = {n.name: n for n in parse_nodes(sample("scontrol-nodes-25.11.json"))}
    assert list(nodes) == ["node1", "node2", "node3", "spare1"]
    assert (nodes["node1"].state, nodes["node1"].reason) == ("DOWN", "recover: xid79 on gpu0")
    assert nodes["node1"].reason_set_by == "root"
    assert nodes["node2"].state == "ALLOCATED"
    # node3 was drained, then resumed: 25.11 still lists the old reason; it is not reported.
    assert (nodes["node3"].state, nodes["node3"].reason) == ("IDLE", "")
    assert nodes["node3"].in_service
    assert nodes["spare1"].drained
    assert nodes["spare1"].reason == "recover: spare"
    assert nodes["spare1"].partitions == ("main",)


def test_squeue_25_11_reads_as_slurm_names_the_jobs() -> None:
    jobs = {j.job_id: j for j in parse_jobs(sample("squeue-25.11.json"))}
    # Requeued at once (expedited) when its node went DOWN: running elsewhere, restart 1.
    assert (jobs["1"].state, jobs["1"].nodes, jobs["1"].restart_count) == ("RUNNING", ("node2",), 1)
    assert "EXPEDITED_REQUEUE" in jobs["1"].flags
    # Its script failed and no Epilog failed: held, holding no node, released by our requeue.
    held = jobs["2"]
    assert (held.state, held.nodes, held.exit_code) == ("REQUEUE_HOLD", (), 3)
    assert held.active
    assert "PENDING" in held.flags
    assert jobs["3"].finished


@pytest.mark.parametrize(
    ("value", "state"),
    [
        (["FAILED", "COMPLETING"], "COMPLETING"),  # still holds its node, as 22.05 says
        (["PENDING", "REQUEUED"], "PENDING"),
        (["PENDING", "REQUEUE_HOLD"], "REQUEUE_HOLD"),
        ("COMPLETING", "COMPLETING"),  # 22.05's one word
    ],
)
def test_job_states_of_both_shapes_read_alike(value: object, state: str) -> None:
    assert job_state(value)[0] == state


@pytest.mark.parametrize(
    ("word", "state"), [("REQUEUED", "PENDING"), ("CONFIGURING", "RUNNING"), ("FAILED", "FAILED")]
)
def test_pyslurms_one_word_becomes_a_state(word: str, state: str) -> None:
    assert job_state_word(word)[0] == state
