"""The local API server fixture itself: what it registers, that RBAC is on, that tokens from
the TokenRequest API work, and that a failed start cleans up and says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kclient
from kubernetes.client import ApiException

from k8s.localapi import KubeBinaries, LocalApiServer
from recovery.errors import ClusterError
from slurm.cluster import ClusterInfo
from tests.plugins.kube_api import (
    NAMESPACE,
    SLURMD_SELECTOR,
    KubeApi,
    KubeNodes,
    create_or_keep,
)
from tests.slurm.helpers import wait_for

pytestmark = pytest.mark.kube


def test_version_is_stamped(kube_api: KubeApi) -> None:
    version = kclient.VersionApi(kube_api.admin_client()).get_code()
    assert (version.git_version, version.major, version.minor) == ("v1.20.2", "1", "20")


def test_nodes_and_slurmd_pods_are_registered(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    core = kclient.CoreV1Api(kube_api.admin_client())
    assert kube_nodes.all == ("node1", "node2", "node3", "spare1")
    nodes = _nodes(kube_api)
    assert sorted(nodes) == sorted(kube_nodes.all)
    for node in nodes.values():
        assert _ready(node) == "True"
        assert not node["spec"].get("unschedulable")
    pods = kube_api.raw(core.list_namespaced_pod(NAMESPACE, label_selector=SLURMD_SELECTOR))
    assert {p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods["items"]} == kube_nodes.pods
    assert sorted(kube_nodes.pods) == sorted(kube_nodes.all)


@pytest.mark.slurm
def test_slurm_cluster_node_names(kube_api: KubeApi, kube_slurm_nodes: KubeNodes,
                                  cluster_info: ClusterInfo) -> None:  # fmt: skip
    assert set(_nodes(kube_api)) == set(cluster_info.nodes + cluster_info.spares)
    assert kube_slurm_nodes.spares == cluster_info.spares


def test_reset_undoes_what_a_test_changed(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    core = kclient.CoreV1Api(kube_api.admin_client())
    core.patch_node("node1", {"spec": {"unschedulable": True}})
    core.delete_node("node2")
    kube_api.set_node_ready("node3", "False", reason="NodeStatusUnknown")
    kube_api.reset()
    kube_api.register(kube_nodes.nodes, kube_nodes.spares)
    nodes = _nodes(kube_api)
    assert sorted(nodes) == sorted(kube_nodes.all)
    assert not nodes["node1"]["spec"].get("unschedulable")
    assert _ready(nodes["node3"]) == "True"


def test_set_node_ready_false(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    kube_api.set_node_ready("node2", "False", reason="KubeletNotReady")
    node = kube_api.raw(kclient.CoreV1Api(kube_api.admin_client()).read_node("node2"))
    (ready,) = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    with pytest.raises(ValueError, match="True, False or Unknown"):
        kube_api.set_node_ready("node2", "no")


def test_graceful_delete_of_a_bound_pod_only_marks_it(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    # No kubelet confirms the delete: the pod stays, marked, until deleted with grace 0.
    core = kclient.CoreV1Api(kube_api.admin_client())
    pod = kube_nodes.pods["node1"]
    core.delete_namespaced_pod(pod, NAMESPACE)
    marked = kube_api.raw(core.read_namespaced_pod(pod, NAMESPACE))
    assert marked["metadata"]["deletionTimestamp"]
    core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod(pod, NAMESPACE)
    assert gone.value.status == 404


def test_rbac_is_on_for_service_account_tokens(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    token = kube_api.service_account_token("rbac-test", "reader")
    core = kclient.CoreV1Api(kube_api.token_client(token))
    with pytest.raises(ApiException) as denied:
        core.list_node()
    assert denied.value.status == 403
    assert "system:serviceaccount:rbac-test:reader" in str(denied.value.body)
    # Granting a Role makes exactly that allowed: the token is valid, RBAC decides.
    admin_rbac = kclient.RbacAuthorizationV1Api(kube_api.admin_client())
    role = {
        "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
    }
    binding = {"metadata": {"name": "reader-reads-pods"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "pod-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader",
                             "namespace": "rbac-test"}]}  # fmt: skip
    create_or_keep(admin_rbac.create_namespaced_role, "rbac-test", role)
    create_or_keep(admin_rbac.create_namespaced_role_binding, "rbac-test", binding)

    def granted() -> list[Any] | None:
        # A new Role reaches the authorizer through its watch, a moment after the create.
        try:
            return [kube_api.raw(core.list_namespaced_pod("rbac-test"))["items"]]
        except ApiException as e:
            if e.status != 403:
                raise
            return None

    assert wait_for(granted, 30, "the pod-reader Role in effect") == [[]]
    with pytest.raises(ApiException) as other_ns:
        core.list_namespaced_pod(NAMESPACE)
    assert other_ns.value.status == 403


def test_a_wrong_token_is_unauthorized(kube_api: KubeApi) -> None:
    with pytest.raises(ApiException) as refused:
        kclient.CoreV1Api(kube_api.token_client("not-a-token-at-all")).list_node()
    assert refused.value.status == 401


def test_kubeconfigs_work_with_kubectl(
    kube_api: KubeApi, kube_nodes: KubeNodes, tmp_path: Path
) -> None:
    out = kube_api.kubectl("get", "nodes", "-o", "json").stdout
    assert sorted(n["metadata"]["name"] for n in json.loads(out)["items"]) == sorted(kube_nodes.all)
    token = kube_api.service_account_token("rbac-test", "nobody")
    cfg = kube_api.write_kubeconfig(tmp_path / "nobody.kubeconfig", token)
    done = kube_api.kubectl(f"--kubeconfig={cfg}", "get", "nodes", check=False)
    assert done.returncode != 0
    assert "forbidden" in done.stderr


def test_failed_start_says_why_and_leaves_nothing(kube_api: KubeApi, tmp_path: Path) -> None:
    broken = tmp_path / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'apiserver: cannot start, on purpose' >&2\nexit 3\n")
    broken.chmod(0o755)
    etcd = shutil.which("etcd")
    assert etcd is not None
    bins = KubeBinaries(broken, kube_api.binaries.kubectl, Path(etcd))
    server = LocalApiServer(tmp_path / "state", binaries=bins)
    with pytest.raises(ClusterError, match="kube-apiserver exited during start") as failed:
        server.start(timeout_s=60)
    assert "cannot start, on purpose" in str(failed.value)
    assert server.processes() == set()
    assert server.info() is None


def _nodes(api: KubeApi) -> dict[str, Any]:
    items = api.raw(kclient.CoreV1Api(api.admin_client()).list_node())["items"]
    return {n["metadata"]["name"]: n for n in items}


def _ready(node: Any) -> str:
    (status,) = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
    return str(status)
