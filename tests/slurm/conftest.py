"""One real local Slurm cluster per test session (munged, slurmctld, 3 slurmd + 1 spare).

Tests marked ``slurm`` share it; the ``slurm_ctl`` fixture hands each test a cluster whose
jobs are cancelled and whose nodes are back in their starting state (node1-3 idle, spare1
drained as a spare), so tests do not depend on their order.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.spares import SPARE_REASON
from slurm import procs
from slurm.cli_slurm import CliSlurm
from slurm.cluster import REQUIRED_PROGRAMS, ClusterInfo, LocalCluster
from tests.slurm.helpers import SLURMD_TIMEOUT_S, wait_for


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's running cluster; stopped at the end, checking nothing is left behind."""
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing and os.environ.get("CI"):
        # .ci/run installs Slurm; a silent skip there would hide the whole tier.
        pytest.fail(f"Slurm tier cannot run in CI: {', '.join(missing)} not on PATH")
    if missing:
        pytest.skip(
            f"Slurm tier skipped: {', '.join(missing)} not installed "
            "(apt-get install -y slurm-wlm munge, or ./scripts/setup.sh)"
        )
    if os.geteuid() != 0:
        pytest.skip("Slurm tier skipped: the local cluster must run as root")
    cluster = LocalCluster(
        tmp_path_factory.mktemp("slurm-cluster"), slurmd_timeout_s=SLURMD_TIMEOUT_S
    )
    cluster.up(nodes=3, spares=1)
    try:
        yield cluster
    finally:
        cluster.down()
        left = procs.cluster_processes(str(cluster.state_dir))
        assert not left, f"processes left behind after cluster down: {sorted(left)}"


@pytest.fixture(scope="session")
def cluster_info(local_cluster: LocalCluster) -> ClusterInfo:
    info = local_cluster.info()
    assert info is not None
    return info


def reset(cluster: LocalCluster, ctl: CliSlurm) -> None:
    """Cancel every job and put every node back in its starting state."""
    info = cluster.info()
    assert info is not None
    ctl.run(["scancel", "--user=root"])
    for name in info.nodes + info.spares:
        cluster.restart_node(name)
    for node in ctl.nodes():
        if node.name in info.spares:
            if not (node.drained and node.reason == SPARE_REASON):
                ctl.run(["scontrol", "update", f"NodeName={node.name}", "State=DRAIN",
                         f"Reason={SPARE_REASON}"])  # fmt: skip
        elif node.down or node.drained:
            ctl.resume(node.name, force=True)

    def settled() -> bool:
        if any(not j.finished for j in ctl.jobs()):
            return False
        for n in ctl.nodes():
            spare = n.name in info.spares
            if n.state != "IDLE" or "NOT_RESPONDING" in n.flags or n.drained != spare:
                return False
        return True

    wait_for(settled, 30, "nodes idle and jobs gone after reset")


@pytest.fixture
def slurm_ctl(local_cluster: LocalCluster) -> Iterator[CliSlurm]:
    """The adapter for the session cluster, reset before and after the test."""
    ctl = local_cluster.control()
    reset(local_cluster, ctl)
    yield ctl
    reset(local_cluster, ctl)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A folder for job scripts and output that slurmd (running as root) can write."""
    d = tmp_path / "jobs"
    d.mkdir()
    return d
