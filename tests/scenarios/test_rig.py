"""The scenario rig's local cluster.

Where it lives: slurmstepd creates a Unix socket per job step in its spool, and a socket path
has at most 107 characters, so a deep run directory gets its cluster in a short temporary
folder instead (the runner moves it into the run afterwards).

How it comes up: through service.bringup (as ``recover cluster up --agents``), and Slurm is
reached through the backend the run asked for (``recover scenario run --slurm-backend``):
checked on the objects built, with the bring-up faked, and once for real with slurmrestd."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from recover import main
from recovery.contract.memplace import node_key
from recovery.errors import ClusterError, UsageError
from recovery.pool.spares import is_ready_spare
from recovery.statedir import Endpoint
from scenarios.rig import bring_up, cluster_root
from scenarios.schema import ClusterSpec
from service import bringup
from service.bringup import LocalUp
from service.wiring import SlurmAccess
from slurm import procs
from slurm.cli_slurm import CliSlurm
from slurm.clusterinfo import (
    SOCKET_PATH_MAX,
    ClusterInfo,
    check_socket_paths,
    longest_socket,
    node_names,
)
from slurm.rest_slurm import RestSlurm
from slurm.restd import RestEndpoint, jwt_plugin_installed
from tests.helpers import record_gone_cluster
from tests.slurm.helpers import require_local_slurm


def test_a_short_run_directory_holds_its_cluster() -> None:
    out = Path("/tmp/runs/xid79")
    assert cluster_root(out, ClusterSpec(nodes=4, spares=1)) == out / "cluster"


def test_a_deep_run_directory_gets_a_short_cluster_folder() -> None:
    out = Path("/tmp/pytest-of-root/pytest-73/test_shipped_scenario_passes_x0/run")
    root = cluster_root(out, ClusterSpec(nodes=3, spares=1))
    assert root.parent == Path(tempfile.gettempdir())
    assert root.name.startswith("recover-scenario-")
    assert len(str(longest_socket(root / "slurm", ["spare1"]))) <= SOCKET_PATH_MAX
    assert cluster_root(out, ClusterSpec(nodes=3, spares=1)) == root  # the same run, the same


def test_a_left_over_short_folder_is_refused(tmp_path: Path) -> None:
    out = Path("/tmp/pytest-of-root/pytest-73/test_a_left_over_short_folder_is_refused0/deep/run")
    root = cluster_root(out, ClusterSpec())
    root.mkdir()
    try:
        with pytest.raises(UsageError, match=r"left from an earlier run .* did not finish"):
            cluster_root(out, ClusterSpec())
    finally:
        root.rmdir()


def test_local_cluster_refuses_a_state_dir_too_deep_for_its_sockets() -> None:
    deep = Path("/tmp/" + "d" * 60 + "/slurm")
    why = r"too long for the Unix sockets .* \(117 characters, at most 107\); .* at most 61 "
    with pytest.raises(UsageError, match=why):
        check_socket_paths(deep, ["node1", "spare1"])
    check_socket_paths(Path("/tmp/x/slurm"), ["node1", "spare1"])


# --- the local bring-up and the Slurm backend ---------------------------------------------


class FakeBringUp:
    """Stands in for service.bringup's processes: records what was asked, starts nothing."""

    def __init__(self, tmp_path: Path, *, fail: BaseException | None = None) -> None:
        self.specs: list[bringup.LocalSpec] = []
        self.envs: list[Mapping[str, str] | None] = []
        self.downs: list[Path] = []
        self.down_envs: list[Mapping[str, str] | None] = []
        self.fail = fail
        self.tmp = tmp_path

    def up(
        self,
        state: Path,
        spec: bringup.LocalSpec,
        *,
        log: Callable[[str], None],
        env: Mapping[str, str] | None = None,
    ) -> LocalUp:
        self.specs.append(spec)
        self.envs.append(env)
        if self.fail is not None:
            raise self.fail
        names, spares = node_names(spec.nodes, spec.spares)
        info = ClusterInfo(state, state / "slurm.conf", names, spares, {}, state / "munge")
        coord = bringup.coordinator_dir(state)
        coord.mkdir(parents=True, exist_ok=True)
        (coord / "tokens").write_text("admin admintoken\n")
        restd = None
        if spec.rest:
            token = state / "jwt" / "token"
            restd = RestEndpoint(
                state / "rest" / "run" / "s.socket", "http://127.0.0.1:6820", token
            )
        log(f"cluster up: nodes {', '.join(names)}")
        return LocalUp(info, restd, Endpoint("http://127.0.0.1:8470", 1, coord), {})

    def down(self, state: Path, env: Mapping[str, str] | None = None) -> list[str]:
        self.downs.append(state)
        self.down_envs.append(env)
        return []


@pytest.fixture
def fake_bringup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBringUp:
    fake = FakeBringUp(tmp_path)
    monkeypatch.setattr(bringup, "up", fake.up)
    monkeypatch.setattr(bringup, "down", fake.down)
    return fake


def test_the_rest_backend_starts_slurmrestd_and_the_rig_talks_through_it(
    tmp_path: Path, fake_bringup: FakeBringUp
) -> None:
    # Another cluster's slurmrestd, token and conf in the environment: not the local cluster's.
    env = {
        "RECOVER_SLURMRESTD": "http://elsewhere:6820",
        "RECOVER_SLURM_JWT_FILE": "/other/token",
        "RECOVER_SLURM_USER": "alice",
        "SLURM_CONF": "/other/slurm.conf",
    }
    rig = bring_up(ClusterSpec(nodes=2, spares=1), tmp_path, lambda _: None,
                   SlurmAccess("rest"), env)  # fmt: skip
    (spec,) = fake_bringup.specs
    assert (spec.rest, spec.coordinator, spec.agents) == (True, True, True)
    assert isinstance(rig.slurm, RestSlurm)
    assert rig.slurm.where == "http://127.0.0.1:6820"
    assert rig.slurm.token_file == tmp_path / "slurm" / "jwt" / "token"
    assert rig.slurm.user == "root"
    assert (rig.nodes, rig.spares) == (("node1", "node2"), ("spare1",))


def test_the_backend_may_come_from_the_environment(
    tmp_path: Path, fake_bringup: FakeBringUp
) -> None:
    rig = bring_up(ClusterSpec(), tmp_path, lambda _: None, SlurmAccess(),
                   {"RECOVER_SLURM_BACKEND": "rest"})  # fmt: skip
    assert fake_bringup.specs[0].rest
    assert isinstance(rig.slurm, RestSlurm)


def test_the_cli_backend_is_the_local_cluster_s_commands(
    tmp_path: Path, fake_bringup: FakeBringUp
) -> None:
    env = {"SLURM_CONF": "/other/slurm.conf", "RECOVER_SLURM_JWT_FILE": "/other/token"}
    rig = bring_up(ClusterSpec(), tmp_path, lambda _: None, SlurmAccess("cli"), env)
    assert not fake_bringup.specs[0].rest
    assert isinstance(rig.slurm, CliSlurm)
    assert rig.slurm.conf_path == tmp_path / "slurm" / "slurm.conf"
    assert rig.slurm.jwt_file is None  # the local cluster's munge, not another's token


def test_the_scenario_s_environment_reaches_every_local_part(
    tmp_path: Path, fake_bringup: FakeBringUp
) -> None:
    """The runner's environment, not this process's: the parts start with it, and a node
    crash empties the memory tier where its jobs keep their copies (RECOVER_MEMORY_DIR)."""
    shm = tmp_path / "shm"
    env = {"RECOVER_MEMORY_DIR": str(shm), "PATH": "/usr/bin"}
    rig = bring_up(ClusterSpec(), tmp_path, lambda _: None, SlurmAccess("cli"), env)
    assert fake_bringup.envs == [env]
    assert rig.local is not None
    conf = record_gone_cluster(rig.local.state, ("node1",))
    (shm / node_key("node1", str(conf))).mkdir(parents=True)
    rig.local.cluster.crash_node("node1")
    assert not (shm / node_key("node1", str(conf))).exists()
    rig.down()
    assert fake_bringup.down_envs == [env]


def test_an_unknown_backend_is_refused_before_anything_starts(
    tmp_path: Path, fake_bringup: FakeBringUp
) -> None:
    known = r"Unknown Slurm backend 'grpc'\. Known: cli, pyslurm, rest"
    with pytest.raises(UsageError, match=known):
        bring_up(ClusterSpec(), tmp_path, lambda _: None, SlurmAccess("grpc"), {})
    assert fake_bringup.specs == []


def test_a_failed_bring_up_stops_what_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBringUp(tmp_path, fail=ClusterError("slurmctld exited during start"))
    monkeypatch.setattr(bringup, "up", fake.up)
    monkeypatch.setattr(bringup, "down", fake.down)
    with pytest.raises(ClusterError, match="slurmctld exited"):
        bring_up(ClusterSpec(), tmp_path, lambda _: None, SlurmAccess("cli"), {})
    assert fake.downs == [tmp_path / "slurm"]


def test_the_scenario_command_passes_the_backend_to_the_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import scenarios.main

    got: dict[str, object] = {}

    def run_command(scenario: str, **kwargs: object) -> int:
        got.update(kwargs, scenario=scenario)
        return 0

    monkeypatch.setattr(scenarios.main, "run_command", run_command)
    assert main(["scenario", "run", "xid94", "--slurm-backend", "rest"]) == 0
    assert got["scenario"] == "xid94"
    assert got["slurm"] == SlurmAccess("rest")


def test_local_slurm_control_without_slurmrestd_says_how(tmp_path: Path) -> None:
    info = ClusterInfo(tmp_path, tmp_path / "slurm.conf", ("node1",), (), {}, tmp_path)
    with pytest.raises(UsageError, match=r"needs the local cluster's slurmrestd"):
        LocalUp(info).slurm_control(SlurmAccess("rest"), {})


@pytest.mark.slow
@pytest.mark.slurm
def test_a_real_local_rig_with_the_rest_backend_reads_slurm_through_slurmrestd(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_local_slurm()
    if shutil.which("slurmrestd") is None or not jwt_plugin_installed():
        pytest.skip("REST tier: slurmrestd or slurm-wlm-jwt-plugin not installed")
    root = tmp_path_factory.mktemp("rig")  # short: slurmstepd's sockets live under it
    lines: list[str] = []
    rig = bring_up(ClusterSpec(nodes=1, spares=1), root, lines.append, SlurmAccess("rest"))
    try:
        assert isinstance(rig.slurm, RestSlurm)
        assert rig.slurm.where.startswith("http://127.0.0.1:")
        views = {n.name: n for n in rig.slurm.nodes()}  # GET /nodes from slurmrestd
        assert set(views) == {"node1", "spare1"}
        assert is_ready_spare(views["spare1"])
        assert rig.client.get("/v1/status")
        assert any(line.startswith("slurmrestd at http://") for line in lines)
    finally:
        stopped = rig.down()
    assert {"slurmrestd", "slurmrestd-local", "coordinator", "agent:node1"} <= set(stopped)
    assert procs.cluster_processes(str(root / "slurm")) == set()
