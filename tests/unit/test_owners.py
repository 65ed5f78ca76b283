"""Other owners' marks, recognised from their documented conventions (pure)."""

from __future__ import annotations

import pytest

from recovery.coordinator.views import holder
from recovery.ports.owners import OtherMark, node_marks, pod_marks, reason_owner
from recovery.ports.slurm import NodeInfo


@pytest.mark.parametrize(
    ("reason", "owner"),
    [
        ("slurm-operator: node cordoned", "slinky"),
        ("sunk:verify-undrain gpu burn failed", "sunk"),
        ("GPU health check failed [hardware_problem]", "soperator"),
        ("[node_problem] boot disk", "soperator"),
        ("Action:Reboot", "hyperpod"),
        ("Action:Replace", "hyperpod"),
        ("recover: xid79 GPU has fallen off the bus", None),
        ("Not responding", None),
        ("bad fan, ticket 42", None),
        ("", None),
    ],
)
def test_reason_owners(reason: str, owner: str | None) -> None:
    assert reason_owner(reason) == owner


def test_holder_names_the_operator_before_the_user() -> None:
    slinky = NodeInfo("n1", "IDLE", frozenset({"DRAIN"}), reason="slurm-operator: x",
                      reason_set_by="slurm")  # fmt: skip
    person = NodeInfo("n2", "DOWN", reason="bad fan", reason_set_by="alice")
    assert (holder(slinky), holder(person)) == ("slinky", "alice")


def test_node_marks_leave_ours_and_kubernetes_own_out() -> None:
    marks = node_marks(
        labels={"node-health-status": "UnschedulablePendingReboot", "team": "ml"},
        annotations={"sunk.coreweave.com/drain": "true"},
        taint_keys=["recover.io/unhealthy", "node.kubernetes.io/unreachable", "gpu/broken"],
        unschedulable=True,
        cordoned_by_us=True,
        our_taint_key="recover.io/unhealthy",
    )
    assert marks == (
        OtherMark("hyperpod", "label node-health-status=UnschedulablePendingReboot"),
        OtherMark("sunk", "annotation sunk.coreweave.com/drain=true"),
        OtherMark("unknown", "taint gpu/broken"),
    )
    healthy = node_marks(labels={"node-health-status": "Schedulable"}, annotations={},
                         taint_keys=[], unschedulable=True, cordoned_by_us=False,
                         our_taint_key="recover.io/unhealthy")  # fmt: skip
    assert healthy == (OtherMark("unknown", "cordoned (spec.unschedulable)"),)


def test_slinkys_pod_cordon_is_theirs_unless_we_set_it() -> None:
    ann = {"nodeset.slinky.slurm.net/pod-cordon": "true"}
    assert [m.owner for m in pod_marks(ann, ours=False)] == ["slinky"]
    assert pod_marks(ann, ours=True) == ()
    assert pod_marks({}, ours=False) == ()
