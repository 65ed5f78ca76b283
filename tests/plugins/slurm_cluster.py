"""One real local Slurm cluster per test session (munged, slurmctld, 3 slurmd + 1 spare).

A plugin (registered in tests/conftest.py) so that the Slurm adapter's tests and the
coordinator's real-daemon tests share one cluster. Tests marked ``slurm`` use it; the
``slurm_ctl`` fixture hands each test a cluster whose jobs are cancelled and whose nodes are
back in their starting state (node1-3 idle, spare1 drained as a spare), so tests do not
depend on their order.

The contract tests of the SlurmControl port take ``slurm_backend`` instead: the same test
runs once per backend (``cli``: Slurm's commands; ``rest``: slurmrestd with a JWT for root,
started on first use for the session cluster, which accepts JWTs). ``slurm_ctl`` stays the
admin that arranges and resets the cluster around them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.policy.requeue import ABNORMAL_END_STATES
from recovery.ports.slurm import SlurmControl
from recovery.spares import SPARE_REASON
from slurm import procs, restd
from slurm.cli_slurm import CliSlurm
from slurm.cluster import ClusterInfo, LocalCluster
from slurm.rest_slurm import RestSlurm
from tests.slurm.helpers import SLURMD_TIMEOUT_S, expect_unsupported, require_local_slurm, wait_for

#: The SlurmControl backends every contract test runs against.
BACKENDS = ("cli", "rest")


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's running cluster; stopped at the end, checking nothing is left behind."""
    require_local_slurm()
    # JWT on when the plugin is there (CI installs it): the REST backend needs it.
    cluster = LocalCluster(
        tmp_path_factory.mktemp("slurm-cluster"),
        slurmd_timeout_s=SLURMD_TIMEOUT_S,
        jwt=restd.jwt_plugin_installed() or bool(os.environ.get("CI")),
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
    """Cancel every job and put every node back in its starting state.

    Jobs that ended abnormally become CANCELLED (held in the queue, then cancelled): slurmctld
    remembers an ended job for MinJobAge (300 s), and a coordinator of a later test would take
    a FAILED job on a node it sees faulted for the fault's victim and requeue it."""
    info = cluster.info()
    assert info is not None
    for job in ctl.jobs():
        if job.state in ABNORMAL_END_STATES and job.requeueable:
            ctl.run(["scontrol", "requeuehold", job.job_id])
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


@pytest.fixture(scope="session")
def rest_endpoint(local_cluster: LocalCluster) -> restd.RestEndpoint:
    """The session cluster's slurmrestd (started on first use, stopped with the cluster)."""
    missing = [p for p in ("slurmrestd",) if shutil.which(p) is None]
    if not restd.jwt_plugin_installed():
        missing.append("slurm-wlm-jwt-plugin")
    if missing:
        why = (
            f"REST backend tier: {', '.join(missing)} not installed "
            "(apt-get install -y slurmrestd slurm-wlm-jwt-plugin, or ./scripts/setup.sh)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)  # .ci/run installs them: a skip there would hide the tier
        pytest.skip(why)
    return local_cluster.start_rest()


def rest_backend(endpoint: restd.RestEndpoint) -> RestSlurm:
    """The REST backend as the contract tests use it: JWT for root over TCP."""
    return RestSlurm(url=endpoint.url, token_file=endpoint.token_file, user=endpoint.user)


@pytest.fixture(params=BACKENDS)
def slurm_backend(request: pytest.FixtureRequest, slurm_ctl: CliSlurm) -> Iterator[SlurmControl]:
    """The backend under test (``cli`` or ``rest``) for the session cluster, which
    ``slurm_ctl`` resets around the test. A test marked ``writes(...)`` that needs a change
    this backend cannot make must fail with SlurmUnsupportedError (see expect_unsupported)."""
    if request.param == "cli":
        ctl: CliSlurm | RestSlurm = slurm_ctl
    else:
        ctl = rest_backend(request.getfixturevalue("rest_endpoint"))
    expect_unsupported(request, ctl)
    yield ctl
    if isinstance(ctl, RestSlurm):
        ctl.close()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A folder for job scripts and output that slurmd (running as root) can write."""
    d = tmp_path / "jobs"
    d.mkdir()
    return d
