"""The adapter's pure half on literal Kubernetes JSON (tests/k8s/samples/: objects as the local
v1.20 API server sent them, managedFields left out): parsing, and the patches that decide
what we write and what we remove."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k8s.parse import (
    clear_patch,
    condition_patch,
    condition_removal,
    labels_patch,
    mark_patch,
    parse_node,
    parse_pod,
    parse_watch_line,
    pod_cordon_patch,
    pod_uncordon_patch,
    timestamp,
)
from recovery.errors import KubeRefusedError
from recovery.ports.nodes import (
    CORDONED_ANNOTATION,
    INCIDENT_ANNOTATION,
    POD_CORDON_ANNOTATION,
    SPARE_LABEL,
    TAINT_KEY,
    OurCondition,
    condition_reason,
)
from recovery.ports.owners import SLINKY_POD_CORDON, OtherMark

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SAMPLES / f"{name}.json").read_text())
    return data


def test_a_fresh_node() -> None:
    node = parse_node(sample("node-fresh"))
    assert (node.name, node.ready, node.ready_reason) == ("node1", "True", "KubeletReady")
    assert node.ready_since == timestamp("2026-12-01T10:50:34Z")
    assert not node.marked
    assert not node.unready
    assert node.others == ()  # node.kubernetes.io/not-ready is Kubernetes' own, not an owner's


def test_a_node_we_marked_beside_sunk_and_hyperpod() -> None:
    node = parse_node(sample("node-marked"))
    assert node.marked
    assert node.cordoned_by_us
    assert node.our_taint == "NoSchedule"
    assert node.condition == OurCondition("False", "Xid79", "inc-20261201-0001")
    assert node.incident == "inc-20261201-0001"
    assert node.others == (
        OtherMark("hyperpod", "label node-health-status=UnschedulablePendingReplacement"),
        OtherMark("sunk", "annotation sunk.coreweave.com/drain=true"),
        OtherMark("sunk", "taint sunk.coreweave.com/lock"),
    )
    assert node.held_by == ["hyperpod", "sunk"]


def test_a_lost_node_is_unready() -> None:
    node = parse_node(sample("node-unknown"))
    assert (node.ready, node.unready, node.ready_reason) == ("Unknown", True, "NodeStatusUnknown")


def test_pods_and_slinkys_cordon() -> None:
    cordoned = parse_pod(sample("pod-slinky-cordon"))
    assert (cordoned.name, cordoned.node, cordoned.terminating) == ("slurmd-node3", "node3", False)
    assert not cordoned.operator_drain_ours
    assert parse_pod(sample("pod-terminating")).terminating
    node = parse_node(sample("node-unknown"), [cordoned])
    assert node.pods == ("slurmd-node3",)
    assert node.held_by == ["slinky"]
    assert pod_cordon_patch(cordoned, "inc-1") is None  # theirs: we do not take it over
    assert pod_uncordon_patch(cordoned) is None


def test_marking_keeps_others_taints_and_carries_the_version() -> None:
    obj = sample("node-marked")
    assert mark_patch(obj, "xid79", "inc-20261201-0001", "NoSchedule") is None  # all held
    fresh = sample("node-fresh")
    patch = mark_patch(fresh, "xid95", "inc-2", "NoExecute")
    assert patch == {
        "metadata": {
            "resourceVersion": fresh["metadata"]["resourceVersion"],
            "annotations": {CORDONED_ANNOTATION: "true", INCIDENT_ANNOTATION: "inc-2"},
        },
        "spec": {
            "unschedulable": True,
            "taints": [
                {"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready"},
                {"key": TAINT_KEY, "value": "xid95", "effect": "NoExecute"},
            ],
        },
    }
    # Another fault on a node we hold: the taint's value follows, the cordon stays ours.
    again = mark_patch(obj, "xid48", "inc-20261201-0001", "NoSchedule")
    assert again is not None
    assert again["spec"]["taints"][-1]["value"] == "xid48"
    assert "unschedulable" not in again["spec"]


def test_clearing_removes_only_ours() -> None:
    obj = sample("node-marked")
    patch = clear_patch(obj)
    assert patch == {
        "metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "annotations": {CORDONED_ANNOTATION: None, INCIDENT_ANNOTATION: None},
        },
        "spec": {
            "unschedulable": None,
            "taints": [
                {"effect": "NoSchedule", "key": "sunk.coreweave.com/lock"},
                {"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready"},
            ],
        },
    }
    assert clear_patch(sample("node-fresh")) is None
    # Cordoned by someone else (no annotation of ours): the cordon stays.
    theirs = sample("node-fresh")
    theirs["spec"]["unschedulable"] = True
    assert clear_patch(theirs) is None


def test_our_condition_is_set_and_removed_by_type() -> None:
    fresh = sample("node-fresh")
    patch = condition_patch(fresh, "node-unreachable", "inc-3", 1_800_000_000.0)
    assert patch == {
        "status": {
            "conditions": [
                {
                    "type": "AcceleratorHealthy",
                    "status": "False",
                    "reason": "NodeUnreachable",
                    "message": "inc-3",
                    "lastHeartbeatTime": "2027-01-15T08:00:00Z",
                    "lastTransitionTime": "2027-01-15T08:00:00Z",
                }
            ]
        }
    }
    marked = sample("node-marked")
    assert condition_patch(marked, "xid79", "inc-20261201-0001", 1_800_000_000.0) is None
    assert condition_removal(marked) == {
        "status": {"conditions": [{"type": "AcceleratorHealthy", "$patch": "delete"}]}
    }
    assert condition_removal(fresh) is None


def test_labels_and_pod_cordon_patches() -> None:
    fresh = sample("node-fresh")
    rv = fresh["metadata"]["resourceVersion"]
    assert labels_patch(fresh, {SPARE_LABEL: "true"}, ["recover.io/promoted"]) == {
        "metadata": {"resourceVersion": rv, "labels": {SPARE_LABEL: "true"}}
    }
    assert labels_patch(fresh, {}, ["recover.io/promoted"]) is None
    pod = parse_pod(sample("pod-terminating"))
    assert pod_cordon_patch(pod, "inc-4") == {
        "metadata": {"annotations": {SLINKY_POD_CORDON: "true", POD_CORDON_ANNOTATION: "inc-4"}}
    }


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("xid79", "Xid79"), ("gpu-lost", "GpuLost"), ("node-unreachable", "NodeUnreachable")],
)
def test_condition_reasons_are_camel_case(fault: str, reason: str) -> None:
    assert condition_reason(fault) == reason


def test_watch_lines() -> None:
    line = json.dumps({"type": "MODIFIED", "object": sample("node-unknown")})
    kind, obj = parse_watch_line(line)
    assert (kind, parse_node(obj).ready) == ("MODIFIED", "Unknown")
    gone = '{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}'
    status = {"kind": "Status", "code": 410, "message": "too old"}
    assert parse_watch_line(gone) == ("ERROR", status)
    with pytest.raises(KubeRefusedError, match="not a watch event"):
        parse_watch_line("<html>proxy error</html>")
