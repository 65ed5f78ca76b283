"""CliSlurm against the real local cluster: reading, marking, idempotence, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.errors import (
    ReasonNotOursError,
    SlurmRefusedError,
    SlurmUnavailableError,
    UsageError,
)
from recovery.retry import Backoff, retry
from slurm.cli_slurm import CliSlurm
from tests.slurm.helpers import output_lines, running, submit_loop, wait_for

pytestmark = pytest.mark.slurm


def test_nodes_report_state_flags_and_our_spare_reason(slurm_ctl: CliSlurm) -> None:
    nodes = {n.name: n for n in slurm_ctl.nodes()}
    assert list(nodes) == ["node1", "node2", "node3", "spare1"]
    assert all(nodes[f"node{i}"].in_service for i in (1, 2, 3))
    spare = nodes["spare1"]
    assert (spare.state, spare.reason) == ("IDLE", "recover: spare")
    assert spare.flags == {"DRAIN"}
    assert spare.reason_is_ours


def test_unknown_node_names_the_known_ones(slurm_ctl: CliSlurm) -> None:
    with pytest.raises(
        UsageError, match=r"Unknown node 'node9'\. Known: node1, node2, node3, spare1"
    ):
        slurm_ctl.drain("node9", "test")
    with pytest.raises(UsageError, match="Invalid node name"):
        slurm_ctl.drain("node1,node2", "test")


def test_drain_and_resume_are_marked_and_idempotent(slurm_ctl: CliSlurm) -> None:
    assert slurm_ctl.drain("node1", "xid79 on gpu0") is True
    node = slurm_ctl.node("node1")
    assert node.drained
    assert node.reason == "recover: xid79 on gpu0"
    assert node.reason_set_by
    assert slurm_ctl.drain("node1", "xid79 on gpu0") is False  # already holds: no-op
    assert slurm_ctl.drain("node1", "recover: xid79 on gpu0") is False  # prefix not doubled
    assert slurm_ctl.resume("node1") is True
    # slurmctld pings a resumed node before trusting it again: NOT_RESPONDING for a moment.
    wait_for(lambda: slurm_ctl.node("node1").in_service, 10, "node1 back in service")
    assert slurm_ctl.resume("node1") is False


def test_down_is_marked_and_idempotent(slurm_ctl: CliSlurm) -> None:
    assert slurm_ctl.down("node2", "xid48 double-bit ECC") is True
    node = slurm_ctl.node("node2")
    assert node.down
    assert node.reason == "recover: xid48 double-bit ECC"
    assert slurm_ctl.down("node2", "xid48 double-bit ECC") is False
    assert slurm_ctl.resume("node2") is True
    wait_for(lambda: slurm_ctl.node("node2").in_service, 10, "node2 back in service")


def test_someone_elses_mark_is_never_undone(slurm_ctl: CliSlurm) -> None:
    slurm_ctl.run(
        ["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bios update (alice)"]
    )
    with pytest.raises(ReasonNotOursError) as info:
        slurm_ctl.resume("node3")
    assert "'bios update (alice)'" in str(info.value)
    assert "set by root" in str(info.value)
    # Our drain of their node is a no-op that keeps their reason...
    assert slurm_ctl.drain("node3", "xid79") is False
    assert slurm_ctl.node("node3").reason == "bios update (alice)"
    # ...and our DOWN keeps it too, so that our resume still refuses afterwards.
    assert slurm_ctl.down("node3", "xid79") is True
    node = slurm_ctl.node("node3")
    assert node.down
    assert node.reason == "bios update (alice)"
    with pytest.raises(ReasonNotOursError):
        slurm_ctl.resume("node3")
    assert slurm_ctl.resume("node3", force=True) is True


def test_drain_then_requeue_moves_the_job(slurm_ctl: CliSlurm, job_dir: Path) -> None:
    job_id = submit_loop(slurm_ctl, job_dir)
    first = wait_for(lambda: running(slurm_ctl, job_id), 15, "job running")
    wait_for(lambda: output_lines(job_dir, 0), 10, "output of the first run")
    (node,) = first.nodes
    assert [j.job_id for j in slurm_ctl.jobs_on(node)] == [job_id]
    assert slurm_ctl.drain(node, "requeue test") is True
    assert slurm_ctl.job(job_id).state == "RUNNING"  # drain lets running jobs run
    assert slurm_ctl.requeue(job_id) is True
    assert slurm_ctl.job(job_id).state in ("COMPLETING", "PENDING")
    assert slurm_ctl.requeue(job_id) is False  # already requeued: no-op
    wait_for(lambda: slurm_ctl.job(job_id).state == "PENDING", 10, "job pending")
    assert slurm_ctl.requeue(job_id) is False
    second = wait_for(lambda: running(slurm_ctl, job_id), 30, "job running again")
    assert second.nodes != first.nodes
    assert second.restart_count == 1
    lines = wait_for(lambda: output_lines(job_dir, 1), 10, "output of the second run")
    assert lines[0][:3] == [job_id, "1", second.nodes[0]]
    assert output_lines(job_dir, 0)[0][2] == node  # append mode kept the first run's lines


def test_submit_and_cancel_are_idempotent(slurm_ctl: CliSlurm, job_dir: Path) -> None:
    job_id = submit_loop(slurm_ctl, job_dir)
    assert slurm_ctl.cancel(job_id) is True
    wait_for(lambda: slurm_ctl.job(job_id).finished, 10, "job cancelled")
    assert slurm_ctl.job(job_id).state == "CANCELLED"
    assert slurm_ctl.cancel(job_id) is False
    assert slurm_ctl.cancel("999999") is False  # never existed: nothing to cancel
    with pytest.raises(UsageError, match="Invalid job id"):
        slurm_ctl.cancel("1; scancel -u root")


def test_refused_request_is_a_verdict(slurm_ctl: CliSlurm) -> None:
    # Refused by scontrol itself...
    with pytest.raises(SlurmRefusedError, match="Valid states are"):
        slurm_ctl.run(["scontrol", "update", "NodeName=node1", "State=BOGUS"])
    # ...and by slurmctld.
    with pytest.raises(SlurmRefusedError, match="Invalid job id specified"):
        slurm_ctl.run(["scontrol", "requeue", "999999"])


def test_unreachable_controller_is_transient_and_retried(
    slurm_ctl: CliSlurm, tmp_path: Path
) -> None:
    # Same cluster, but pointed at a port where no slurmctld listens.
    conf = tmp_path / "slurm.conf"
    text = slurm_ctl.conf_path.read_text()
    port_line = next(ln for ln in text.splitlines() if ln.startswith("SlurmctldPort="))
    conf.write_text(text.replace(port_line, "SlurmctldPort=9"))
    dead = CliSlurm(conf, timeout_s=20)
    waits: list[float] = []
    with pytest.raises(SlurmUnavailableError, match="slurmctld unreachable"):
        retry(dead.nodes, Backoff(attempts=2, initial_s=0.1), sleep=waits.append)
    assert waits == [0.1]
