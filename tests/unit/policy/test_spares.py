"""Spare choice: same topology group first (settings map, then Slurm features), then by name."""

from __future__ import annotations

from types import MappingProxyType

from recovery.policy import PolicyConfig, SpareTopology, choose_spare, topology_group

from .helpers import node, spare


def _config(groups: dict[str, str] | None = None, prefix: str | None = None) -> PolicyConfig:
    return PolicyConfig(spares=SpareTopology(MappingProxyType(groups or {}), prefix))


READY = [spare("s3"), spare("s1"), spare("s2")]


def test_no_spare() -> None:
    assert choose_spare([], "n1", PolicyConfig()) is None


def test_by_name_without_topology() -> None:
    assert choose_spare(READY, "n1", PolicyConfig()).name == "s1"  # type: ignore[union-attr]


def test_same_group_from_the_settings_map() -> None:
    config = _config({"n1": "rack-b", "s1": "rack-a", "s2": "rack-b", "s3": "rack-b"})
    assert choose_spare(READY, "n1", config).name == "s2"  # type: ignore[union-attr]


def test_falls_back_to_any_spare_by_name() -> None:
    config = _config({"n1": "rack-z", "s1": "rack-a", "s2": "rack-b"})
    assert choose_spare(READY, "n1", config).name == "s1"  # type: ignore[union-attr]


def test_same_group_from_slurm_features() -> None:
    ready = [
        spare("s1", features=frozenset({"nvl-1", "h200"})),
        spare("s2", features=frozenset({"nvl-2"})),
    ]
    failed = node("n1", features=frozenset({"h200", "nvl-2"}))
    config = _config(prefix="nvl-")
    assert topology_group(failed, config) == "nvl-2"
    assert choose_spare(ready, failed, config).name == "s2"  # type: ignore[union-attr]
    # Without the prefix configured, features mean nothing: by name.
    assert choose_spare(ready, failed, PolicyConfig()).name == "s1"  # type: ignore[union-attr]


def test_settings_map_wins_over_features() -> None:
    config = _config({"n1": "nvl-1"}, prefix="nvl-")
    failed = node("n1", features=frozenset({"nvl-2"}))
    assert topology_group(failed, config) == "nvl-1"
    assert topology_group("n1", config) == "nvl-1"
    assert topology_group("n2", config) is None
