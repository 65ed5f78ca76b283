"""Where a node's memory-tier copies live: one directory per node and cluster, so that a
crash of one local cluster's node1 (recovery.contract.memplace.forget_node) empties nothing of
another cluster's node1 on the same host."""

from __future__ import annotations

from pathlib import Path

from recovery.contract.memplace import environ_node_key, forget_node, node_key


def test_the_key_is_the_node_and_its_cluster(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a/slurm.conf"), str(tmp_path / "b/slurm.conf")
    assert node_key("node1", None) == "node1"
    assert node_key("node1", a) != node_key("node1", b)
    assert node_key("node1", a).startswith("node1@")
    assert node_key("node1", a) == node_key("node1", str(tmp_path / "a/../a/slurm.conf"))
    env = {"SLURMD_NODENAME": "node2", "SLURM_CONF": a}
    assert environ_node_key(env) == node_key("node2", a)


def test_forgetting_one_clusters_node_leaves_the_others(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    a, b = str(tmp_path / "a/slurm.conf"), str(tmp_path / "b/slurm.conf")
    mine = root / node_key("node1", a) / "run" / "id"
    theirs = root / node_key("node1", b) / "run" / "id"
    for d in (mine, theirs):
        d.mkdir(parents=True)
        (d / "slot-0.bin").write_bytes(b"x")
    forget_node(root, node_key("node1", a))
    assert not mine.exists()
    assert (theirs / "slot-0.bin").exists()


def test_copies_no_run_wrote_for_a_day_are_freed_when_a_run_starts(tmp_path: Path) -> None:
    import os

    from recovery.api.memory import STALE_S, MemoryTier

    node = tmp_path / "shm" / "node1"
    stale = node / "run-gone" / "id"
    recent = node / "run-paused" / "id"
    for d in (stale, recent):
        d.mkdir(parents=True)
        (d / "slot-0.bin").write_bytes(b"x")
    old = os.path.getmtime(stale) - STALE_S - 60
    for path in (stale.parent, stale, stale / "slot-0.bin"):
        os.utime(path, (old, old))
    MemoryTier(node / "run-mine" / "id", every=1, run_config={"m": 1}, processes=2)
    assert not stale.parent.exists()
    assert (recent / "slot-0.bin").exists()
