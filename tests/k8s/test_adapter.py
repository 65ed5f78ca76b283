"""The Kubernetes adapter against the real local API server: our marks on, only ours off, spares
labelled, slurmd pods removed, 404 as done, and other owners' marks left alone."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as kclient

from recovery.errors import KubeNotFoundError, KubeRefusedError
from recovery.ports.nodes import (
    CONDITION_TYPE,
    CORDONED_ANNOTATION,
    INCIDENT_ANNOTATION,
    PROMOTED_LABEL,
    SPARE_LABEL,
    TAINT_KEY,
)
from recovery.ports.owners import SLINKY_POD_CORDON, SUNK_DRAIN_ANNOTATION, SUNK_LOCK_TAINT
from tests.k8s.helpers import condition, control, gone_or_terminating, node_json, pod_json, taints
from tests.plugins.kube_api import KubeApi, KubeNodes
from tests.slurm.helpers import wait_for

pytestmark = pytest.mark.kube

OURS = {"key": TAINT_KEY, "value": "xid79", "effect": "NoSchedule"}


def _core(kube: KubeApi) -> kclient.CoreV1Api:
    return kclient.CoreV1Api(kube.admin_client())


def _others_marks(kube: KubeApi, node: str) -> None:
    """What SUNK and HyperPod (and a person) leave on a node."""
    _core(kube).patch_node(
        node,
        {
            "metadata": {
                "labels": {"node-health-status": "UnschedulablePendingReboot"},
                "annotations": {SUNK_DRAIN_ANNOTATION: "gpu check failed"},
            },
            "spec": {"taints": [{"key": SUNK_LOCK_TAINT, "value": "x", "effect": "NoSchedule"}]},
        },
    )


@pytest.mark.slow
def test_mark_cordons_taints_annotates_and_conditions(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    ctl = control(kube_api.admin_client(), kube_nodes)
    assert ctl.mark_unhealthy("node2", "xid79", "inc-1") is True
    obj = node_json(kube_api, "node2")
    assert obj["spec"]["unschedulable"] is True
    assert taints(obj) == [OURS]
    ann = obj["metadata"]["annotations"]
    assert (ann[CORDONED_ANNOTATION], ann[INCIDENT_ANNOTATION]) == ("true", "inc-1")
    cond = condition(obj, CONDITION_TYPE)
    assert cond is not None
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Xid79", "inc-1")
    assert condition(obj, "Ready")["status"] == "True"  # type: ignore[index]  # kubelet's kept
    assert ctl.mark_unhealthy("node2", "xid79", "inc-1") is False  # already held: no write
    assert (
        node_json(kube_api, "node2")["metadata"]["resourceVersion"]
        == (obj["metadata"]["resourceVersion"])
    )
    (seen,) = [n for n in ctl.nodes() if n.name == "node2"]
    assert seen.marked
    assert seen.cordoned_by_us
    assert seen.our_taint == "NoSchedule"
    assert seen.incident == "inc-1"
    assert seen.others == ()
    assert not [n for n in ctl.nodes() if n.name != "node2" and n.marked]


def test_noexecute_is_configurable(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    ctl = control(kube_api.admin_client(), kube_nodes, taint_effect="NoExecute")
    ctl.mark_unhealthy("node1", "gpu-lost", "inc-2")
    obj = node_json(kube_api, "node1")
    assert taints(obj) == [{"key": TAINT_KEY, "value": "gpu-lost", "effect": "NoExecute"}]
    assert condition(obj, CONDITION_TYPE)["reason"] == "GpuLost"  # type: ignore[index]


def test_clear_removes_only_our_marks(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    _others_marks(kube_api, "node3")
    ctl = control(kube_api.admin_client(), kube_nodes)
    ctl.mark_unhealthy("node3", "xid79", "inc-3")
    (marked,) = [n for n in ctl.nodes() if n.name == "node3"]
    assert marked.held_by == ["hyperpod", "sunk"]
    assert ctl.clear_marks("node3") is True
    obj = node_json(kube_api, "node3")
    assert not obj["spec"].get("unschedulable")
    assert taints(obj) == [{"key": SUNK_LOCK_TAINT, "value": "x", "effect": "NoSchedule"}]
    assert obj["metadata"]["annotations"] == {SUNK_DRAIN_ANNOTATION: "gpu check failed"}
    assert obj["metadata"]["labels"]["node-health-status"] == "UnschedulablePendingReboot"
    assert condition(obj, CONDITION_TYPE) is None
    assert condition(obj, "Ready") is not None
    assert ctl.clear_marks("node3") is False


def test_someone_elses_cordon_stays_after_our_clear(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    _core(kube_api).patch_node("node1", {"spec": {"unschedulable": True}})  # kubectl cordon
    ctl = control(kube_api.admin_client(), kube_nodes)
    assert ctl.mark_unhealthy("node1", "xid95", "inc-4") is True
    obj = node_json(kube_api, "node1")
    assert CORDONED_ANNOTATION not in obj["metadata"]["annotations"]
    (seen,) = [n for n in ctl.nodes() if n.name == "node1"]
    assert [m.what for m in seen.others] == ["cordoned (spec.unschedulable)"]
    ctl.clear_marks("node1")
    assert node_json(kube_api, "node1")["spec"]["unschedulable"] is True


def test_spares_are_promoted_and_retired_by_our_labels(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    ctl = control(kube_api.admin_client(), kube_nodes)
    assert ctl.retire_spare("spare1") is True
    assert ctl.retire_spare("spare1") is False
    labels = node_json(kube_api, "spare1")["metadata"]["labels"]
    assert labels[SPARE_LABEL] == "true"
    assert PROMOTED_LABEL not in labels
    assert labels["kubernetes.io/hostname"] == "spare1"  # theirs kept
    assert ctl.promote_spare("spare1") is True
    assert ctl.promote_spare("spare1") is False
    labels = node_json(kube_api, "spare1")["metadata"]["labels"]
    assert labels[PROMOTED_LABEL] == "true"
    assert SPARE_LABEL not in labels
    # A failed spare is no spare: marking it drops our labels.
    ctl.retire_spare("spare1")
    ctl.mark_unhealthy("spare1", "xid79", "inc-5")
    labels = node_json(kube_api, "spare1")["metadata"]["labels"]
    assert SPARE_LABEL not in labels
    assert PROMOTED_LABEL not in labels


def test_slurmd_pods_of_one_node_are_deleted(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    ns = kube_nodes.namespace
    ctl = control(kube_api.admin_client(), kube_nodes)
    assert ctl.delete_slurmd_pods("node2") == ["slurmd-node2"]
    assert gone_or_terminating(kube_api, ns, "slurmd-node2")
    assert ctl.delete_slurmd_pods("node2") == []  # terminating or gone: done
    for other in ("node1", "node3", "spare1"):
        pod = pod_json(kube_api, ns, f"slurmd-{other}")
        assert pod is not None
        assert not pod["metadata"].get("deletionTimestamp")
    now = control(kube_api.admin_client(), kube_nodes, grace_s=0)
    assert now.delete_slurmd_pods("node1") == ["slurmd-node1"]
    assert pod_json(kube_api, ns, "slurmd-node1") is None


def test_eviction_uses_the_version_the_server_offers(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    group = kclient.ApisApi(kube_api.admin_client()).get_api_versions()
    (policy,) = [g for g in kube_api.raw(group)["groups"] if g["name"] == "policy"]
    offered = {v["version"] for v in policy["versions"]}
    ctl = control(kube_api.admin_client(), kube_nodes, pod_removal="evict")
    assert ctl.eviction_version() == ("policy/v1" if "v1" in offered else "policy/v1beta1")
    assert ctl.delete_slurmd_pods("node3") == ["slurmd-node3"]
    assert gone_or_terminating(kube_api, kube_nodes.namespace, "slurmd-node3")


def test_a_node_that_is_gone(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    ctl = control(kube_api.admin_client(), kube_nodes)
    ctl.mark_unhealthy("node2", "xid79", "inc-6")
    _core(kube_api).delete_node("node2")
    wait_for(lambda: "node2" not in {n.name for n in ctl.nodes()}, 10, "node2 gone")
    assert ctl.clear_marks("node2") is False  # nothing of ours left to remove: done
    assert ctl.delete_slurmd_pods("ghost") == []
    with pytest.raises(KubeNotFoundError, match="ghost"):
        ctl.mark_unhealthy("ghost", "xid79", "inc-7")
    with pytest.raises(KubeNotFoundError, match="ghost"):
        ctl.promote_spare("ghost")


def test_a_bad_request_is_a_verdict_with_the_servers_words(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    ctl = control(kube_api.admin_client(), kube_nodes, pod_selector="app in (slurmd")
    with pytest.raises(KubeRefusedError, match=r"list pods in slurm: refused \(400\)"):
        ctl.delete_slurmd_pods("node1")


def test_operator_drain_is_asked_through_slinkys_pod_annotation(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    ns = kube_nodes.namespace
    # Someone else (Slinky's own upgrade logic, a person) cordoned spare1's pod already.
    _core(kube_api).patch_namespaced_pod(
        "slurmd-spare1", ns, {"metadata": {"annotations": {SLINKY_POD_CORDON: "true"}}}
    )
    ctl = control(kube_api.admin_client(), kube_nodes)
    assert ctl.request_operator_drain("node1", "inc-8") == ["slurmd-node1"]
    assert ctl.request_operator_drain("node1", "inc-8") == []
    assert ctl.request_operator_drain("spare1", "inc-9") == []  # theirs: not noted as ours
    (spare,) = [n for n in ctl.nodes() if n.name == "spare1"]
    assert spare.held_by == ["slinky"]
    (ours,) = [n for n in ctl.nodes() if n.name == "node1"]
    assert ours.held_by == []
    assert ctl.withdraw_operator_drain("node1") == ["slurmd-node1"]
    assert ctl.withdraw_operator_drain("spare1") == []
    ann: dict[str, Any] = pod_json(kube_api, ns, "slurmd-spare1")["metadata"]["annotations"]  # type: ignore[index]
    assert ann == {SLINKY_POD_CORDON: "true"}
    node1 = pod_json(kube_api, ns, "slurmd-node1")
    assert node1 is not None
    assert not node1["metadata"].get("annotations")
