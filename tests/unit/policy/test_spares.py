"""Spare choice: same topology group first (settings map, then Slurm features), then by name;
made when deciding, from the view, and part of the decision."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from recovery.model import Decision, PromoteSpare, RequeueJobs, Verdict
from recovery.policy import (
    Catalogue,
    ClusterView,
    PolicyConfig,
    PolicyState,
    SpareTopology,
    choose_spare,
    decide,
    differences,
    topology_group,
)

from .helpers import T0, event, node, spare


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


# --- the choice is part of the decision --------------------------------------------------------


def _promoted(d: Decision) -> str | None:
    (promote,) = [a for a in d.actions if isinstance(a, PromoteSpare)]
    return promote.spare


def test_a_replacement_names_the_spare_chosen_from_the_view(catalogue: Catalogue) -> None:
    view = ClusterView.from_nodes([node("n1"), node("n2"), spare("s2"), spare("s1")])
    state = PolicyState.empty()
    d = decide(state, event("xid79", "n1"), view, PolicyConfig(), catalogue, T0)
    assert _promoted(d) == "s1"
    # A spare promised to an earlier decision is not chosen again; none left: None.
    d = decide(state, event("xid79", "n2"), view, PolicyConfig(), catalogue, T0, taken={"s1"})
    assert _promoted(d) == "s2"
    both = {"s1", "s2"}
    assert (
        _promoted(decide(state, event("xid79"), view, PolicyConfig(), catalogue, T0, taken=both))
        is None
    )


def test_a_spare_that_does_not_answer_is_not_chosen(catalogue: Catalogue) -> None:
    silent = replace(spare("s1"), flags=frozenset({"DRAIN", "NOT_RESPONDING"}))
    view = ClusterView.from_nodes([node("n1"), silent, spare("s2")])
    d = decide(PolicyState.empty(), event("xid95"), view, PolicyConfig(), catalogue, T0)
    assert _promoted(d) == "s2"  # drain-reset promotes too


def test_the_failed_nodes_features_name_its_group(catalogue: Catalogue) -> None:
    view = ClusterView.from_nodes(
        [
            node("n1", features=frozenset({"nvl-2"})),
            spare("s1", features=frozenset({"nvl-1"})),
            spare("s2", features=frozenset({"nvl-2"})),
        ]
    )
    d = decide(PolicyState.empty(), event("xid79"), view, _config(prefix="nvl-"), catalogue, T0)
    assert _promoted(d) == "s2"


def test_replay_does_not_compare_which_spare() -> None:
    ev = event("xid79")
    recorded = Decision(ev.id, "n1", "xid79", Verdict.replace_node, (PromoteSpare("n1", "s1"),))
    replayed = replace(recorded, actions=(PromoteSpare("n1", None),))
    assert differences(recorded, replayed) == ()
    other = replace(recorded, actions=(RequeueJobs("n1"),))
    assert differences(recorded, other) == ("actions",)
