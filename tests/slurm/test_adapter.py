"""The SlurmControl contract against the real local cluster, once per backend (``slurm_backend``:
cli, rest): reading, marking, idempotence, refusals. ``slurm_ctl`` (the CLI, as root) only
arranges what someone else would have done."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.errors import (
    ReasonNotOursError,
    SlurmRefusedError,
    SlurmUnavailableError,
    UsageError,
)
from recovery.ports.slurm import BatchJob, SlurmControl
from recovery.retry import Backoff, retry
from slurm.cli_slurm import CliSlurm
from slurm.rest_slurm import RestSlurm
from tests.slurm.helpers import output_lines, running, submit_loop, wait_for

pytestmark = pytest.mark.slurm


def test_nodes_report_state_flags_and_our_spare_reason(slurm_backend: SlurmControl) -> None:
    nodes = {n.name: n for n in slurm_backend.nodes()}
    assert list(nodes) == ["node1", "node2", "node3", "spare1"]
    assert all(nodes[f"node{i}"].in_service for i in (1, 2, 3))
    spare = nodes["spare1"]
    assert (spare.state, spare.reason) == ("IDLE", "recover: spare")
    assert spare.flags == {"DRAIN"}
    assert spare.reason_is_ours


def test_unknown_node_names_the_known_ones(slurm_backend: SlurmControl) -> None:
    with pytest.raises(
        UsageError, match=r"Unknown node 'node9'\. Known: node1, node2, node3, spare1"
    ):
        slurm_backend.drain("node9", "test")
    with pytest.raises(UsageError, match="Invalid node name"):
        slurm_backend.drain("node1,node2", "test")


@pytest.mark.writes("drain", "resume")
def test_drain_and_resume_are_marked_and_idempotent(slurm_backend: SlurmControl) -> None:
    assert slurm_backend.drain("node1", "xid79 on gpu0") is True
    node = slurm_backend.node("node1")
    assert node.drained
    assert node.reason == "recover: xid79 on gpu0"
    assert node.reason_set_by
    assert slurm_backend.drain("node1", "xid79 on gpu0") is False  # already holds: no-op
    assert slurm_backend.drain("node1", "recover: xid79 on gpu0") is False  # prefix not doubled
    assert slurm_backend.resume("node1") is True
    # slurmctld pings a resumed node before trusting it again: NOT_RESPONDING for a moment.
    wait_for(lambda: slurm_backend.node("node1").in_service, 10, "node1 back in service")
    assert slurm_backend.resume("node1") is False


@pytest.mark.writes("down", "resume")
def test_down_is_marked_and_idempotent(slurm_backend: SlurmControl) -> None:
    assert slurm_backend.down("node2", "xid48 double-bit ECC") is True
    node = slurm_backend.node("node2")
    assert node.down
    assert node.reason == "recover: xid48 double-bit ECC"
    assert slurm_backend.down("node2", "xid48 double-bit ECC") is False
    assert slurm_backend.resume("node2") is True
    wait_for(lambda: slurm_backend.node("node2").in_service, 10, "node2 back in service")


@pytest.mark.writes("down", "resume")
def test_someone_elses_mark_is_never_undone(
    slurm_backend: SlurmControl, slurm_ctl: CliSlurm
) -> None:
    slurm_ctl.run(
        ["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bios update (alice)"]
    )
    with pytest.raises(ReasonNotOursError) as info:
        slurm_backend.resume("node3")
    assert "'bios update (alice)'" in str(info.value)
    assert "set by root" in str(info.value)
    # Our drain of their node is a no-op that keeps their reason...
    assert slurm_backend.drain("node3", "xid79") is False
    assert slurm_backend.node("node3").reason == "bios update (alice)"
    # ...and our DOWN keeps it too, so that our resume still refuses afterwards.
    assert slurm_backend.down("node3", "xid79") is True
    node = slurm_backend.node("node3")
    assert node.down
    assert node.reason == "bios update (alice)"
    with pytest.raises(ReasonNotOursError):
        slurm_backend.resume("node3")
    assert slurm_backend.resume("node3", force=True) is True


@pytest.mark.slow
@pytest.mark.writes("drain", "requeue")
def test_drain_then_requeue_moves_the_job(slurm_backend: SlurmControl, job_dir: Path) -> None:
    job_id = submit_loop(slurm_backend, job_dir)
    first = wait_for(lambda: running(slurm_backend, job_id), 15, "job running")
    wait_for(lambda: output_lines(job_dir, 0), 10, "output of the first run")
    (node,) = first.nodes
    assert [j.job_id for j in slurm_backend.jobs_on(node)] == [job_id]
    assert slurm_backend.drain(node, "requeue test") is True
    assert slurm_backend.job(job_id).state == "RUNNING"  # drain lets running jobs run
    assert slurm_backend.requeue(job_id) is True
    assert slurm_backend.job(job_id).state in ("COMPLETING", "PENDING")
    assert slurm_backend.requeue(job_id) is False  # already requeued: no-op
    wait_for(lambda: slurm_backend.job(job_id).state == "PENDING", 10, "job pending")
    assert slurm_backend.requeue(job_id) is False
    second = wait_for(lambda: running(slurm_backend, job_id), 30, "job running again")
    assert second.nodes != first.nodes
    assert second.restart_count == 1
    lines = wait_for(lambda: output_lines(job_dir, 1), 10, "output of the second run")
    assert lines[0][:3] == [job_id, "1", second.nodes[0]]
    assert output_lines(job_dir, 0)[0][2] == node  # append mode kept the first run's lines


def test_submit_and_cancel_are_idempotent(slurm_backend: SlurmControl, job_dir: Path) -> None:
    job_id = submit_loop(slurm_backend, job_dir)
    assert slurm_backend.cancel(job_id) is True
    wait_for(lambda: slurm_backend.job(job_id).finished, 10, "job cancelled")
    assert slurm_backend.job(job_id).state == "CANCELLED"
    assert slurm_backend.cancel(job_id) is False
    assert slurm_backend.cancel("999999") is False  # never existed: nothing to cancel
    with pytest.raises(UsageError, match="Invalid job id"):
        slurm_backend.cancel("1; scancel -u root")


def test_refused_submission_is_a_verdict(slurm_backend: SlurmControl, job_dir: Path) -> None:
    job = BatchJob(
        script="#!/bin/bash\ntrue\n", options={"partition": "nope"}, workdir=str(job_dir)
    )
    with pytest.raises(SlurmRefusedError, match="Invalid partition name specified"):
        slurm_backend.submit(job)


def test_refused_command_is_a_verdict(slurm_ctl: CliSlurm) -> None:
    # Refused by scontrol itself...
    with pytest.raises(SlurmRefusedError, match="Valid states are"):
        slurm_ctl.run(["scontrol", "update", "NodeName=node1", "State=BOGUS"])
    # ...and by slurmctld.
    with pytest.raises(SlurmRefusedError, match="Invalid job id specified"):
        slurm_ctl.run(["scontrol", "requeue", "999999"])


def unreachable_twin(ctl: SlurmControl, tmp_path: Path) -> SlurmControl:
    """The same backend pointed at a port where nothing listens."""
    if isinstance(ctl, RestSlurm):
        assert ctl.token_file is not None
        return RestSlurm(url="http://127.0.0.1:9", token_file=ctl.token_file, user=ctl.user)
    assert isinstance(ctl, CliSlurm)
    conf = tmp_path / "slurm.conf"
    text = ctl.conf_path.read_text()
    port_line = next(ln for ln in text.splitlines() if ln.startswith("SlurmctldPort="))
    conf.write_text(text.replace(port_line, "SlurmctldPort=9"))
    return CliSlurm(conf, timeout_s=20)


@pytest.mark.slow
def test_unreachable_controller_is_transient_and_retried(
    slurm_backend: SlurmControl, tmp_path: Path
) -> None:
    dead = unreachable_twin(slurm_backend, tmp_path)
    waits: list[float] = []
    with pytest.raises(SlurmUnavailableError, match="unreachable"):
        retry(dead.nodes, Backoff(attempts=2, initial_s=0.1), sleep=waits.append)
    assert waits == [0.1]
