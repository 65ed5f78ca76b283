"""Rules builds one cluster view per Slurm snapshot, not one per event."""

from __future__ import annotations

from recovery.coordinator.rules import Rules
from recovery.policy import PolicyConfig, load_catalogue
from recovery.ports.slurm import NodeInfo


def _nodes(*names: str) -> tuple[NodeInfo, ...]:
    return tuple(NodeInfo(n, "IDLE", partitions=("main",)) for n in names)


def test_the_same_snapshot_gives_the_same_view() -> None:
    rules = Rules(PolicyConfig.default(), load_catalogue())
    snapshot = _nodes("a", "b")
    assert rules.view(snapshot) is rules.view(snapshot)


def test_a_new_snapshot_gives_a_new_view() -> None:
    rules = Rules(PolicyConfig.default(), load_catalogue())
    first = rules.view(_nodes("a", "b"))
    second = rules.view(_nodes("a", "b", "c"))
    assert first.partition_sizes == {"main": 2}
    assert second.partition_sizes == {"main": 3}


def test_a_list_is_never_cached() -> None:
    # A list can change under the cache; only an immutable tuple is remembered.
    rules = Rules(PolicyConfig.default(), load_catalogue())
    nodes = list(_nodes("a"))
    assert rules.view(nodes).partition_sizes == {"main": 1}
    nodes.append(NodeInfo("b", "IDLE", partitions=("main",)))
    assert rules.view(nodes).partition_sizes == {"main": 2}
