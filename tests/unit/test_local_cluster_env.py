"""The local cluster's environment is the one it was given, all the way down: a crashed node
(and the cluster's take-down) empties the memory tier where the cluster's jobs keep their
copies (their ``RECOVER_MEMORY_DIR``), not where this process's environment points."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.contract.memplace import ENV_MEMORY_DIR, node_key
from slurm import install
from slurm.cluster import LocalCluster
from tests.helpers import record_gone_cluster


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The cluster's memory root and this process's (``$RECOVER_MEMORY_DIR`` set elsewhere)."""
    ours, process = tmp_path / "cluster-shm", tmp_path / "process-shm"
    monkeypatch.setenv(ENV_MEMORY_DIR, str(process))
    return ours, process


def _copies(roots: tuple[Path, Path], conf: Path, node: str) -> Path:
    key = node_key(node, str(conf))
    for root in roots:
        (root / key / "run").mkdir(parents=True)
    return Path(key)


def _cluster(state: Path, root: Path) -> LocalCluster:
    return LocalCluster(
        state,
        install=install.SYSTEM,
        env={ENV_MEMORY_DIR: str(root)},
        clock=lambda: 0.0,
        sleep=lambda _s: None,
    )


def test_a_crashed_node_loses_the_copies_under_the_cluster_s_memory_root(
    tmp_path: Path, roots: tuple[Path, Path]
) -> None:
    ours, process = roots
    conf = record_gone_cluster(tmp_path / "slurm", ("node1", "node2"))
    key = _copies(roots, conf, "node1")
    other = _copies(roots, conf, "node2")
    assert _cluster(tmp_path / "slurm", ours).crash_node("node1") == []
    assert not (ours / key).exists()
    assert (ours / other).exists()  # another node keeps its copies
    assert (process / key).exists()  # this process's environment is not the cluster's


def test_the_take_down_empties_every_node_under_the_cluster_s_memory_root(
    tmp_path: Path, roots: tuple[Path, Path]
) -> None:
    ours, process = roots
    conf = record_gone_cluster(tmp_path / "slurm", ("node1", "node2"))
    keys = [_copies(roots, conf, n) for n in ("node1", "node2")]
    assert _cluster(tmp_path / "slurm", ours).down() == []
    assert not any((ours / k).exists() for k in keys)
    assert all((process / k).exists() for k in keys)
