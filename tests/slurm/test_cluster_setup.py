"""Pure parts of the local cluster's set-up: names, paths, conf text, munge's and slurmrestd's
folders."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import replace
from pathlib import Path

import pytest

from recovery.errors import SlurmNotInstalledError, UsageError
from recovery.ports.slurm import NodeInfo
from slurm import restd
from slurm.cluster import (
    ClusterStatus,
    check_installed,
    default_state_dir,
    node_names,
    resolve_conf,
)
from slurm.conf import ClusterLayout, render_slurm_conf
from slurm.install import SlurmInstall
from slurm.munge import MungePaths, choose_home, traversable_by


def test_node_names() -> None:
    assert node_names(3, 1) == (("node1", "node2", "node3"), ("spare1",))
    assert node_names(1, 0) == (("node1",), ())
    nodes, spares = node_names(512, 64)
    assert (nodes[-1], spares[-1]) == ("node512", "spare64")


@pytest.mark.parametrize(("nodes", "spares"), [(0, 1), (513, 0), (2, -1), (2, 65)])
def test_node_counts_out_of_range(nodes: int, spares: int) -> None:
    with pytest.raises(UsageError, match="expected"):
        node_names(nodes, spares)


def test_default_state_dir(tmp_path: Path) -> None:
    assert default_state_dir({}, cwd=tmp_path) == tmp_path / ".state" / "slurm"
    env = {"RECOVER_STATE_DIR": str(tmp_path / "s")}
    assert default_state_dir(env, cwd=Path("/elsewhere")) == tmp_path / "s" / "slurm"


def test_missing_programs_are_named_with_the_install_command() -> None:
    with pytest.raises(SlurmNotInstalledError) as info:
        check_installed(which=lambda p: None if p in ("slurmctld", "munged") else f"/usr/bin/{p}")
    assert "missing slurmctld, munged" in str(info.value)
    assert "apt-get install -y slurm-wlm munge" in str(info.value)
    assert "./scripts/setup.sh" in str(info.value)


def test_resolve_conf(tmp_path: Path) -> None:
    assert resolve_conf("/etc/slurm/slurm.conf", tmp_path) == Path("/etc/slurm/slurm.conf")
    with pytest.raises(UsageError, match="recover cluster up"):
        resolve_conf(None, tmp_path)
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "cluster.json").write_text("{}")
    assert resolve_conf(None, tmp_path) == tmp_path / "slurm.conf"


def test_conf_has_the_settings_recovery_depends_on(tmp_path: Path) -> None:
    layout = ClusterLayout(
        state_dir=tmp_path,
        hostname="vm",
        nodes=("node1", "node2"),
        spares=("spare1",),
        ctld_port=7000,
        node_ports=(7001, 7002, 7003),
        munge_socket=Path("/m/run/munge.socket"),
        slurmd_timeout_s=6,
    )
    lines = render_slurm_conf(layout).splitlines()
    for expected in [
        "SlurmctldHost=vm(127.0.0.1)",
        "SlurmctldPort=7000",
        "AuthInfo=socket=/m/run/munge.socket,cred_expire=10",
        "ReturnToService=1",
        "JobRequeue=1",
        "SlurmdTimeout=6",
        f"SlurmdSpoolDir={tmp_path}/spool/slurmd.%n",
        "NodeName=node1 NodeHostname=vm NodeAddr=127.0.0.1 Port=7001 CPUs=1 RealMemory=500",
        "NodeName=spare1 NodeHostname=vm NodeAddr=127.0.0.1 Port=7003 CPUs=1 RealMemory=500 "
        'State=DRAIN Reason="recover: spare"',
        "PartitionName=main Nodes=node1,node2,spare1 Default=YES MaxTime=INFINITE State=UP",
    ]:
        assert expected in lines
    assert not [ln for ln in lines if ln.startswith("AuthAlt")]  # munge only, unless asked
    jwt = render_slurm_conf(replace(layout, jwt_key=tmp_path / "jwt" / "k")).splitlines()
    assert "AuthAltTypes=auth/jwt" in jwt
    assert f"AuthAltParameters=jwt_key={tmp_path}/jwt/k" in jwt
    # Debian's 22.05 by default: named so, no expedited requeue, no Epilog.
    assert "# recover-slurm: 22.05 system" in lines
    assert not [ln for ln in lines if ln.startswith(("SlurmctldParameters", "Epilog"))]
    built = SlurmInstall("25.11", tmp_path / "build")
    fast = replace(layout, install=built, expedite=True, epilog=tmp_path / "epilog")
    text = render_slurm_conf(fast).splitlines()
    assert f"# recover-slurm: 25.11 {tmp_path}/build" in text
    assert "SlurmctldParameters=enable_expedited_requeue" in text
    assert f"Epilog={tmp_path}/epilog" in text
    assert "ReturnToService=1" in text  # 2 would put an expedited job back on a DOWN node
    with pytest.raises(UsageError, match=r"expedited requeue needs Slurm 25\.11"):
        render_slurm_conf(replace(layout, expedite=True))


def test_slurmrestd_moves_out_of_a_folder_nobody_cannot_reach(tmp_path: Path) -> None:
    # slurmrestd runs as nobody; pytest's base folder is 0700.
    paths = restd.choose_home(tmp_path / "state", tmp_root=Path("/tmp"))
    assert paths.home.parent == Path("/tmp")
    assert paths.home.name.startswith("recover-rest-")
    assert len(str(paths.socket)) < 100
    reachable = restd.choose_home(Path("/usr/share/recover-test-state"))
    assert reachable.home == Path("/usr/share/recover-test-state/rest")


def test_traversable_by_checks_every_folder_on_the_way(tmp_path: Path) -> None:
    # Open to everyone all the way down: any user may pass.
    assert traversable_by(Path("/usr/share/doc"), 54321, {54321})
    # pytest's own base folder is 0700: only its owner passes.
    owner = os.stat(tmp_path).st_uid
    assert traversable_by(tmp_path / "state", owner, set())
    assert not traversable_by(tmp_path / "state", 54321, {54321})
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0o600)  # no execute bit, even for the owner
    assert not traversable_by(closed / "state", owner, set())


def test_munge_moves_out_of_a_folder_user_munge_cannot_reach(tmp_path: Path) -> None:
    try:
        pwd.getpwnam("munge")
    except KeyError:
        pytest.skip("munge is not installed")
    paths = choose_home(tmp_path / "state", tmp_root=Path("/tmp"))  # under a 0700 folder
    assert paths.home.parent == Path("/tmp")
    assert paths.home.name.startswith("recover-munge-")
    assert len(str(paths.socket)) < 100
    reachable = choose_home(Path("/usr/share/recover-test-state"))
    assert reachable.home == Path("/usr/share/recover-test-state/munge")


def test_munge_paths_keep_key_and_socket_apart() -> None:
    paths = MungePaths(Path("/s/munge"))
    assert paths.key.parent != paths.socket.parent
    assert paths.key_dir == Path("/s/munge/key")
    assert paths.socket == Path("/s/munge/run/munge.socket")


def test_status_json_and_text_carry_every_node_field(tmp_path: Path) -> None:
    node = NodeInfo(
        "node1",
        "IDLE",
        frozenset({"DRAIN", "NOT_RESPONDING"}),
        "recover: spare",
        "root",
        cpus=2,
        partitions=("main",),
        features=frozenset({"rack2", "gpu"}),
    )
    status = ClusterStatus(tmp_path, True, tmp_path / "slurm.conf", nodes=(node,))
    (shown,) = json.loads(json.dumps(status.to_json()))["nodes"]
    assert shown["flags"] == ["DRAIN", "NOT_RESPONDING"]
    assert shown["features"] == ["gpu", "rack2"]
    assert shown["partitions"] == ["main"]
    assert "node1      IDLE+DRAIN+NOT_RESPONDING recover: spare" in status.render()
