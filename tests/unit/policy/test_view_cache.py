"""What the breaker asks on every take-out decision is computed cheaply: the cluster view's
derived sets once per view (at 10,000 nodes recounting them cost more than the decision), the
held incidents in one pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from recovery.model import Verdict
from recovery.policy import ClusterView, Incident, NodeState, PolicyState
from recovery.policy.state import frozen_map

from .helpers import Run, cluster, node


def test_partition_sizes_are_counted_once_per_view() -> None:
    view = cluster(n=3, spares=1)
    assert view.partition_sizes == {"gpu": 3}  # the spare serves no jobs
    assert view.partition_sizes is view.partition_sizes
    assert view.spares is view.spares
    assert view.in_service is view.in_service


def test_a_new_view_counts_afresh() -> None:
    a = ClusterView.from_nodes([node("n1"), node("n2", "cpu")])
    b = ClusterView.from_nodes([node("n1"), node("n2"), node("n3", "cpu")])
    assert a.partition_sizes == {"gpu": 1, "cpu": 1}
    assert b.partition_sizes == {"gpu": 2, "cpu": 1}


def test_first_held_is_the_oldest_and_counts_them_all() -> None:
    inc = Incident("inc-b", "xid79", Verdict.replace_node, 5.0, 5.0, frozen_map({}), held=True)
    state = PolicyState.empty()
    assert state.first_held() == (0, None)
    state = state.with_node("n2", NodeState(incident=inc))
    state = state.with_node("n1", NodeState(incident=replace(inc, id="inc-a")))
    state = state.with_node("n0", NodeState(incident=replace(inc, id="inc-c", opened_at=9.0)))
    state = state.with_node("n3", NodeState(incident=replace(inc, id="inc-d", held=False)))
    # Same opening time: the node name breaks the tie, as held_incidents() orders them.
    assert state.first_held() == (3, "inc-a")
    assert state.held_incidents()[0][1].id == "inc-a"


@pytest.mark.parametrize(
    "others_out",
    [
        0,  # the window is smaller than the gpu limit: nothing to count
        2,  # the window reaches the gpu limit, but with cpu nodes only
        3,
    ],
)
def test_the_partition_limit_counts_only_that_partitions_nodes(
    make_run: Callable[..., Run], others_out: int
) -> None:
    gpu = [node(f"g{i}", "gpu") for i in range(1, 5)]  # at most 2 of 4 per window
    cpu = [node(f"c{i}", "cpu") for i in range(1, 9)]
    run = make_run(view=ClusterView.from_nodes(gpu + cpu))
    for i in range(1, others_out + 1):
        assert not run.send("xid79", node=f"c{i}").held
    assert not run.send("xid79", node="g1").held
    assert not run.send("xid79", node="g2").held
    third = run.send("xid79", node="g3")
    assert third.held
    assert "2 of 4 node(s) of partition gpu" in third.why
