"""A node set DOWN, or one whose slurmd crashes: the requeueable job runs on elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.ports.slurm import NodeInfo
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.slurm.helpers import (
    SLURMD_TIMEOUT_S,
    down_node,
    output_lines,
    running,
    submit_loop,
    wait_for,
)

pytestmark = pytest.mark.slurm


@pytest.mark.slow
def test_down_requeues_the_job_onto_another_node(slurm_ctl: CliSlurm, job_dir: Path) -> None:
    job_id = submit_loop(slurm_ctl, job_dir)
    first = wait_for(lambda: running(slurm_ctl, job_id), 15, "job running")
    wait_for(lambda: output_lines(job_dir, 0), 10, "output of the first run")
    (node,) = first.nodes
    assert slurm_ctl.down(node, "xid79 gpu fell off the bus") is True
    # Slurm requeues it by itself; it may start again after cred_expire + 1 s.
    second = wait_for(lambda: running(slurm_ctl, job_id), 30, "job running again")
    assert second.restart_count == 1
    assert node not in second.nodes
    lines = wait_for(lambda: output_lines(job_dir, 1), 10, "output of the second run")
    assert lines[0][2] == second.nodes[0]


@pytest.mark.slow
def test_crashed_slurmd_gets_its_node_down_and_the_job_requeued(
    local_cluster: LocalCluster, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    job_id = submit_loop(slurm_ctl, job_dir)
    first = wait_for(lambda: running(slurm_ctl, job_id), 15, "job running")
    wait_for(lambda: output_lines(job_dir, 0), 10, "output of the first run")
    (node,) = first.nodes
    killed = local_cluster.crash_node(node)
    assert len(killed) >= 2  # slurmd, its job step and the job's processes
    down = wait_for(lambda: down_node(slurm_ctl, node), 4 * SLURMD_TIMEOUT_S, f"{node} DOWN")
    assert "NOT_RESPONDING" in down.flags
    second = wait_for(lambda: running(slurm_ctl, job_id), 40, "job running elsewhere")
    assert second.restart_count == 1
    assert node not in second.nodes
    wait_for(lambda: output_lines(job_dir, 1), 10, "output of the second run")
    # Nothing of the first run survives on the crashed node: only the new run writes.
    before = len(output_lines(job_dir, 0))
    wait_for(lambda: len(output_lines(job_dir, 1)) >= 3, 10, "the second run progressing")
    assert len(output_lines(job_dir, 0)) == before


@pytest.mark.slow
def test_a_crashed_node_we_mark_stays_out_when_its_slurmd_returns(
    local_cluster: LocalCluster, slurm_ctl: CliSlurm
) -> None:
    local_cluster.crash_node("node3")
    lost = wait_for(lambda: down_node(slurm_ctl, "node3"), 4 * SLURMD_TIMEOUT_S, "node3 DOWN")
    # Slurm's own mark, which it would undo itself when slurmd registers: not another owner's.
    assert (lost.reason, "NOT_RESPONDING" in lost.flags) == ("Not responding", True)
    assert not lost.held_by_other
    assert slurm_ctl.down("node3", "xid79 gpu fell off the bus") is True
    local_cluster.restart_node("node3")

    def registered() -> NodeInfo | None:
        node = slurm_ctl.node("node3")
        return None if "NOT_RESPONDING" in node.flags else node

    back = wait_for(registered, 20, "node3's slurmd registered again")
    assert (back.state, back.reason) == ("DOWN", "recover: xid79 gpu fell off the bus")
    assert slurm_ctl.resume("node3") is True  # ours, so ours to undo
    wait_for(lambda: slurm_ctl.node("node3").in_service, 10, "node3 back in service")
