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

Slurm 25.11 tier: a backend named ``NAME@25.11`` (``cli@25.11``, ``rest@25.11``,
``pyslurm@25.11``) runs the same test on a second session cluster, ``local_cluster_2511``, on
the build of ``scripts/build-slurm.sh`` (expedited requeue allowed); ``slurm_ctl`` then resets
and arranges that cluster. Without the build those cases are skipped with the reason (in CI,
which builds it, they fail).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.policy.requeue import ABNORMAL_END_STATES
from recovery.pool.spares import SPARE_REASON
from recovery.ports.slurm import SlurmControl
from slurm import install, procs, restd
from slurm.cli_slurm import CliSlurm
from slurm.cluster import ClusterInfo, LocalCluster
from slurm.rest_slurm import RestSlurm, connect
from tests.slurm.helpers import SLURMD_TIMEOUT_S, expect_unsupported, require_local_slurm


def pytest_configure(config: pytest.Config) -> None:
    # Every local cluster the suite starts through `recover cluster up`, the scenario runner
    # or `recover demo` (auto: 25.11 where it is built) runs on Debian's 22.05 unless
    # RECOVER_SLURM says otherwise: the 25.11 tier starts its own clusters by name and stays
    # a few minutes long.
    os.environ.setdefault("RECOVER_SLURM", "22.05")


#: The SlurmControl backends every contract test runs against: on Debian's 22.05, and
#: (``@25.11``) on the 25.11 build.
BACKENDS = ("cli", "rest", "cli@25.11", "rest@25.11", "pyslurm@25.11")
V2511 = "25.11"


def split_backend(param: str) -> tuple[str, str]:
    """(backend, Slurm series) of a backend parameter: ``rest@25.11`` -> (rest, 25.11);
    a bare name runs on 22.05."""
    name, _, version = param.partition("@")
    return name, version or "22.05"


def require_2511() -> install.SlurmInstall:
    """The 25.11 build, or skip (fail in CI, which builds it) saying how to get it."""
    built = install.build()
    if built is None:
        why = f"Slurm 25.11 tier: not built; {install.BUILD_HINT}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return built


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
def local_cluster_2511(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's cluster on Slurm 25.11 (JWT on, expedited requeue allowed, no Epilog):
    same layout as ``local_cluster``."""
    require_local_slurm()
    built = require_2511()
    cluster = LocalCluster(
        tmp_path_factory.mktemp("slurm2511"),
        slurmd_timeout_s=SLURMD_TIMEOUT_S,
        jwt=True,
        install=built,
        expedite=True,
    )
    cluster.up(nodes=3, spares=1)
    try:
        yield cluster
    finally:
        cluster.down()
        left = procs.cluster_processes(str(cluster.state_dir))
        assert not left, f"processes left behind after cluster down: {sorted(left)}"


def _series_of(request: pytest.FixtureRequest) -> str:
    # A contract test is parametrised by backend (``slurm_backend`` or ``side``); its name says
    # which cluster it runs on. Any other test gets the 22.05 cluster.
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    param = params.get("slurm_backend") or params.get("side") or "cli"
    return split_backend(str(param))[1]


@pytest.fixture
def slurm_cluster(request: pytest.FixtureRequest) -> LocalCluster:
    """The session cluster this test runs on: ``local_cluster_2511`` for a ``NAME@25.11``
    backend, else ``local_cluster``."""
    name = "local_cluster_2511" if _series_of(request) == V2511 else "local_cluster"
    cluster: LocalCluster = request.getfixturevalue(name)
    return cluster


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
    for word in ctl.run(["scontrol", "show", "reservation"]).split():
        if word.startswith("ReservationName="):  # a burn-in's, left by a failed test
            ctl.run(["scontrol", "delete", word])
    for name in info.nodes + info.spares:
        cluster.restart_node(name)

    def put_back() -> list[str]:
        """Mark every node as it starts (again: a node whose slurmd was crashed comes back
        DOWN once it registers if it was resumed before); what is not settled yet."""
        unsettled = [f"job {j.job_id} {j.state}" for j in ctl.jobs() if not j.finished]
        for node in ctl.nodes():
            spare = node.name in info.spares
            if spare and not (node.drained and node.reason == SPARE_REASON):
                ctl.run(["scontrol", "update", f"NodeName={node.name}", "State=DRAIN",
                         f"Reason={SPARE_REASON}"])  # fmt: skip
            elif not spare and (node.down or node.drained):
                ctl.resume(node.name, force=True)
            if node.state != "IDLE" or "NOT_RESPONDING" in node.flags or node.drained != spare:
                unsettled.append(f"{node.name} {node.state} {'+'.join(node.flags)}")
        return unsettled

    # Under load a restarted slurmd may take tens of seconds to register; the cluster is
    # shared by the whole session, so waiting longer costs less than a failed test.
    deadline = time.monotonic() + 90
    while unsettled := put_back():
        if time.monotonic() > deadline:
            pytest.fail(f"nodes not idle or jobs not gone 90 s after reset: {unsettled}")
        time.sleep(0.5)


@pytest.fixture
def slurm_ctl(slurm_cluster: LocalCluster) -> Iterator[CliSlurm]:
    """The CLI adapter for the test's session cluster, reset before and after the test."""
    ctl = slurm_cluster.control()
    reset(slurm_cluster, ctl)
    yield ctl
    reset(slurm_cluster, ctl)


@pytest.fixture
def rest_endpoint(request: pytest.FixtureRequest) -> restd.RestEndpoint:
    """The slurmrestd of the test's session cluster (started on first use, stopped with the
    cluster)."""
    name = "rest_endpoint_2511" if _series_of(request) == V2511 else "rest_endpoint_2205"
    endpoint: restd.RestEndpoint = request.getfixturevalue(name)
    return endpoint


@pytest.fixture(scope="session")
def rest_endpoint_2511(local_cluster_2511: LocalCluster) -> restd.RestEndpoint:
    """The 25.11 session cluster's slurmrestd (the build always has it and auth/jwt)."""
    return local_cluster_2511.start_rest()


@pytest.fixture(scope="session")
def rest_endpoint_2205(local_cluster: LocalCluster) -> restd.RestEndpoint:
    """The 22.05 session cluster's slurmrestd (started on first use, stopped with the cluster)."""
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
    """The REST backend as the contract tests use it: JWT for root over TCP, speaking the
    newest version the daemon offers (v0.0.38 on 22.05, v0.0.44 on 25.11)."""
    return connect(url=endpoint.url, token_file=endpoint.token_file, user=endpoint.user)


@pytest.fixture(params=BACKENDS)
def slurm_backend(request: pytest.FixtureRequest, slurm_ctl: CliSlurm) -> Iterator[SlurmControl]:
    """The backend under test (``cli`` or ``rest``) for the session cluster, which
    ``slurm_ctl`` resets around the test. A test marked ``writes(...)`` that needs a change
    this backend cannot make must fail with SlurmUnsupportedError (see expect_unsupported)."""
    ctl = backend_for(request, split_backend(request.param)[0], slurm_ctl)
    expect_unsupported(request, ctl)
    yield ctl
    if isinstance(ctl, RestSlurm):
        ctl.close()


def backend_for(request: pytest.FixtureRequest, name: str, admin: CliSlurm) -> SlurmControl:
    """Backend ``name`` for the test's session cluster: ``admin`` itself for cli, a REST
    client of its slurmrestd, or pyslurm (which needs the cluster's conf in this process)."""
    if name == "cli":
        return admin
    if name == "rest":
        return rest_backend(request.getfixturevalue("rest_endpoint"))
    from slurm.pyslurm_slurm import PySlurm, unavailable

    why = unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"pyslurm tier: {why}")
        pytest.skip(f"pyslurm tier: {why}")
    return PySlurm(admin.conf_path)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A folder for job scripts and output that slurmd (running as root) can write."""
    d = tmp_path / "jobs"
    d.mkdir()
    return d
