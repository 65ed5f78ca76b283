"""The NodeControl contract, one set of cases for the fake and the real adapter.

Each case runs against ``fake`` (tests/fakes/nodes.py: the fast tier, what the engine's
Kubernetes unit tests stand on) and ``real`` (k8s.nodes.KubeControl on the session's real
API server, marked ``kube``). Someone else's marks are arranged with the same JSON merge
patch on both (:meth:`Side.patch_node`, :meth:`Side.patch_pod`); then the port acts, and the
fake passes only where it does what the real adapter does: every action idempotent, its
return value "changed or not", our marks only ours, and other owners' marks never undone.

The layout is the ``kube_nodes`` one: node1..node3 and spare1, each with a slurmd pod
``slurmd-NAME`` in namespace ``slurm``. The real adapter deletes pods with grace 0 (no
kubelet runs here to finish a graceful delete; the fake's pods go at once, as a kubelet's).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import pytest

from k8s.transport import MERGE_PATCH, Transport
from recovery.errors import KubeNotFoundError
from recovery.ports.nodes import KubeNode, NodeControl, OurCondition
from recovery.ports.owners import (
    HYPERPOD_HEALTH_LABEL,
    SLINKY_POD_CORDON,
    SUNK_DRAIN_ANNOTATION,
    SUNK_LOCK_TAINT,
    OtherMark,
)
from tests.fakes.nodes import FakeNodes
from tests.k8s.helpers import control
from tests.plugins.kube_api import KubeApi, KubeNodes

NAMES = ["node1", "node2", "node3", "spare1"]
CORDONED = OtherMark("unknown", "cordoned (spec.unschedulable)")


class Side(Protocol):
    """One NodeControl under test (``ctl``) and what someone else does around it."""

    ctl: NodeControl

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        """Someone else's JSON merge patch of Node ``name``."""
        ...

    def patch_pod(self, name: str, patch: Mapping[str, Any]) -> None:
        """Someone else's JSON merge patch of pod ``name`` (namespace ``slurm``)."""
        ...


class FakeSide:
    def __init__(self) -> None:
        self.fake = FakeNodes(NAMES)
        self.ctl: NodeControl = self.fake

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        self.fake.patch_node(name, patch)

    def patch_pod(self, name: str, patch: Mapping[str, Any]) -> None:
        self.fake.patch_pod(name, patch)


class RealSide:
    def __init__(self, kube: KubeApi, layout: KubeNodes) -> None:
        self.ctl: NodeControl = control(kube.admin_client(), layout, grace_s=0)
        self.t = Transport(kube.admin_client())
        self.namespace = layout.namespace

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        self.t.request(
            "PATCH", f"/api/v1/nodes/{name}", what=f"patch nodes {name}", body=dict(patch),
            content_type=MERGE_PATCH,
        )  # fmt: skip

    def patch_pod(self, name: str, patch: Mapping[str, Any]) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
        self.t.request(
            "PATCH", path, what=f"patch pods {name}", body=dict(patch), content_type=MERGE_PATCH
        )


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.kube)])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    """The NodeControl under test: the fake, or the real adapter on the real API server."""
    if request.param == "fake":
        yield FakeSide()
        return
    kube: KubeApi = request.getfixturevalue("kube_api")
    yield RealSide(kube, request.getfixturevalue("kube_nodes"))


def view(side: Side, name: str) -> KubeNode:
    (node,) = [n for n in side.ctl.nodes() if n.name == name]
    return node


def sunk_and_hyperpod(side: Side, name: str) -> None:
    """What SUNK and HyperPod leave on a node: a lock taint, a drain annotation, a label."""
    side.patch_node(
        name,
        {
            "metadata": {
                "labels": {HYPERPOD_HEALTH_LABEL: "UnschedulablePendingReboot"},
                "annotations": {SUNK_DRAIN_ANNOTATION: "gpu check failed"},
            },
            "spec": {"taints": [{"key": SUNK_LOCK_TAINT, "value": "x", "effect": "NoSchedule"}]},
        },
    )


# --- reading --------------------------------------------------------------------------------


def test_nodes_list_every_node_with_its_slurmd_pod(side: Side) -> None:
    nodes = side.ctl.nodes()
    assert [n.name for n in nodes] == NAMES
    for n in nodes:
        assert (n.ready, n.unready, n.pods) == ("True", False, (f"slurmd-{n.name}",))
        assert not n.marked
        assert (n.unschedulable, n.spare, n.promoted, n.incident) == (False, False, False, "")
        assert (n.others, n.held_by) == ((), [])


def test_watch_starts_with_every_node(side: Side) -> None:
    side.ctl.mark_unhealthy("node2", "xid79", "inc-1")
    first = list(itertools.islice(side.ctl.watch(lambda: False), len(NAMES)))
    assert sorted(n.name for n in first) == NAMES
    assert [n.name for n in first if n.marked] == ["node2"]


# --- our marks ------------------------------------------------------------------------------


def test_mark_is_idempotent_and_says_which_fault_and_incident(side: Side) -> None:
    assert side.ctl.mark_unhealthy("node2", "xid79", "inc-1") is True
    node = view(side, "node2")
    assert node.marked
    assert (node.unschedulable, node.cordoned_by_us, node.our_taint) == (True, True, "NoSchedule")
    assert node.condition == OurCondition("False", "Xid79", "inc-1")
    assert node.incident == "inc-1"
    assert (node.ready, node.others) == ("True", ())  # the kubelet's condition is kept
    assert side.ctl.mark_unhealthy("node2", "xid79", "inc-1") is False  # holds: no write
    assert side.ctl.mark_unhealthy("node2", "xid79", "inc-2") is True  # another incident
    assert view(side, "node2").condition == OurCondition("False", "Xid79", "inc-2")
    assert side.ctl.mark_unhealthy("node2", "gpu-lost", "inc-2") is True  # another fault
    node = view(side, "node2")
    assert node.condition == OurCondition("False", "GpuLost", "inc-2")
    assert node.cordoned_by_us
    assert [n.name for n in side.ctl.nodes() if n.marked] == ["node2"]


def test_clear_removes_our_marks_once(side: Side) -> None:
    assert side.ctl.clear_marks("node1") is False  # none of ours: nothing to do
    side.ctl.mark_unhealthy("node1", "xid79", "inc-1")
    assert side.ctl.clear_marks("node1") is True
    node = view(side, "node1")
    assert not node.marked
    assert (node.unschedulable, node.cordoned_by_us, node.our_taint) == (False, False, None)
    assert (node.condition, node.incident, node.ready) == (None, "", "True")
    assert side.ctl.clear_marks("node1") is False


def test_spare_labels_are_idempotent_and_a_mark_drops_them(side: Side) -> None:
    assert side.ctl.retire_spare("spare1") is True
    assert side.ctl.retire_spare("spare1") is False
    assert (view(side, "spare1").spare, view(side, "spare1").promoted) == (True, False)
    assert side.ctl.promote_spare("spare1") is True
    assert side.ctl.promote_spare("spare1") is False
    assert (view(side, "spare1").spare, view(side, "spare1").promoted) == (False, True)
    side.ctl.retire_spare("spare1")
    assert side.ctl.mark_unhealthy("spare1", "xid79", "inc-5") is True  # a failed spare...
    assert (view(side, "spare1").spare, view(side, "spare1").promoted) == (False, False)
    assert side.ctl.clear_marks("spare1") is True  # ...and clearing gives no label back
    assert (view(side, "spare1").spare, view(side, "spare1").promoted) == (False, False)


def test_slurmd_pods_are_removed_once(side: Side) -> None:
    assert side.ctl.delete_slurmd_pods("node2") == ["slurmd-node2"]
    assert side.ctl.delete_slurmd_pods("node2") == []  # gone: done
    pods = {n.name: n.pods for n in side.ctl.nodes()}
    assert pods == {n: () if n == "node2" else (f"slurmd-{n}",) for n in NAMES}


# --- other owners' marks --------------------------------------------------------------------


def test_someone_elses_cordon_is_never_undone(side: Side) -> None:
    side.patch_node("node1", {"spec": {"unschedulable": True}})  # kubectl cordon
    assert view(side, "node1").others == (CORDONED,)
    assert side.ctl.mark_unhealthy("node1", "xid95", "inc-4") is True
    node = view(side, "node1")
    assert (node.unschedulable, node.cordoned_by_us, node.marked) == (True, False, True)
    assert node.others == (CORDONED,)
    assert side.ctl.mark_unhealthy("node1", "xid95", "inc-4") is False
    assert side.ctl.clear_marks("node1") is True
    node = view(side, "node1")
    assert (node.unschedulable, node.marked, node.others) == (True, False, (CORDONED,))
    assert side.ctl.clear_marks("node1") is False


def test_other_owners_marks_stay_through_our_mark_and_clear(side: Side) -> None:
    sunk_and_hyperpod(side, "node3")
    before = view(side, "node3").others
    assert view(side, "node3").held_by == ["hyperpod", "sunk"]
    assert OtherMark("sunk", f"taint {SUNK_LOCK_TAINT}") in before
    assert side.ctl.mark_unhealthy("node3", "xid79", "inc-3") is True
    assert view(side, "node3").others == before
    assert side.ctl.clear_marks("node3") is True
    node = view(side, "node3")
    assert (node.others, node.marked, node.unschedulable) == (before, False, False)
    assert side.ctl.clear_marks("node3") is False


def test_operator_drain_is_requested_once_and_withdrawn_only_where_ours(side: Side) -> None:
    # Someone else (Slinky's own upgrade logic, a person) cordoned spare1's pod already.
    side.patch_pod("slurmd-spare1", {"metadata": {"annotations": {SLINKY_POD_CORDON: "true"}}})
    assert view(side, "spare1").held_by == ["slinky"]
    assert side.ctl.request_operator_drain("node1", "inc-8") == ["slurmd-node1"]
    assert side.ctl.request_operator_drain("node1", "inc-8") == []
    assert side.ctl.request_operator_drain("spare1", "inc-9") == []  # theirs: left theirs
    assert view(side, "node1").held_by == []  # ours is no other owner's
    assert side.ctl.withdraw_operator_drain("node1") == ["slurmd-node1"]
    assert side.ctl.withdraw_operator_drain("node1") == []
    assert side.ctl.withdraw_operator_drain("spare1") == []
    assert view(side, "spare1").held_by == ["slinky"]


# --- a node Kubernetes does not know --------------------------------------------------------


def test_a_node_kubernetes_does_not_know(side: Side) -> None:
    acts: list[Callable[[], bool]] = [
        lambda: side.ctl.mark_unhealthy("ghost", "xid79", "inc-7"),
        lambda: side.ctl.promote_spare("ghost"),
        lambda: side.ctl.retire_spare("ghost"),
    ]
    for act in acts:
        with pytest.raises(KubeNotFoundError, match="ghost"):
            act()
    assert side.ctl.clear_marks("ghost") is False  # gone means done
    assert side.ctl.delete_slurmd_pods("ghost") == []
    assert side.ctl.request_operator_drain("ghost", "inc-7") == []  # no pod there
    assert side.ctl.withdraw_operator_drain("ghost") == []
