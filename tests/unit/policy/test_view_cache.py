"""The cluster view computes its derived sets once: the breaker asks for them on every
take-out decision, and at 10,000 nodes recounting them cost more than the decision."""

from __future__ import annotations

from recovery.policy import ClusterView

from .helpers import cluster, node


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
