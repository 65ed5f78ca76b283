"""Where a scenario's local cluster lives: slurmstepd creates a Unix socket per job step in
its spool, and a socket path has at most 107 characters, so a deep run directory gets its
cluster in a short temporary folder instead (the runner moves it into the run afterwards)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from recovery.errors import UsageError
from scenarios.rig import cluster_root
from scenarios.schema import ClusterSpec
from slurm.clusterinfo import SOCKET_PATH_MAX, check_socket_paths, longest_socket


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
