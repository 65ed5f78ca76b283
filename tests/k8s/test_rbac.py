"""k8s/deploy/rbac.yaml on the real API server: with the coordinator ServiceAccount's token
every adapter operation succeeds, the rules grant exactly what the adapter asks for (recorded
request by request), and what it must not do is refused (403)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kclient
from kubernetes.client import ApiException

from k8s.lease import KubeLease
from k8s.nodes import KubeControl, KubeSettings
from k8s.transport import Query, Transport
from recovery.errors import KubeForbiddenError
from tests.k8s.helpers import Watching, gone_or_terminating
from tests.plugins.kube_api import KubeApi, KubeNodes, create_or_keep
from tests.slurm.helpers import wait_for

pytestmark = pytest.mark.kube

RBAC = Path(__file__).resolve().parents[2] / "k8s" / "deploy" / "rbac.yaml"
SA_NAMESPACE, SA_NAME = "recover", "recover-coordinator"


class Recording(Transport):
    """Notes every request as the RBAC (verb, resource, namespace) it needs."""

    def __init__(self, api: kclient.ApiClient) -> None:
        super().__init__(api, timeout_s=10.0)
        self.used: set[tuple[str, str, str]] = set()

    def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.used.add(rbac_verb(method, path, watch=False))
        return super().request(method, path, **kw)

    def lines(self, path: str, *, what: str, query: Query, read_timeout_s: float) -> Iterator[str]:
        self.used.add(rbac_verb("GET", path, watch=True))
        return super().lines(path, what=what, query=query, read_timeout_s=read_timeout_s)


_PATH = re.compile(
    r"^/(?:api/v1|apis/coordination\.k8s\.io/v1)(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<kind>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)
_VERBS = {"PATCH": "patch", "DELETE": "delete", "POST": "create", "PUT": "update"}


def rbac_verb(method: str, path: str, *, watch: bool) -> tuple[str, str, str]:
    """The RBAC verb, resource (with subresource) and namespace a request needs; discovery
    (``/apis/policy``, granted to every authenticated user) as ``("discovery", path, "")``."""
    m = _PATH.match(path)
    if m is None:
        return ("discovery", path, "")
    resource = m["kind"] + (f"/{m['sub']}" if m["sub"] else "")
    if method == "GET":
        verb = "watch" if watch else "get" if m["name"] else "list"
    else:
        verb = _VERBS[method]
    return (verb, resource, m["ns"] or "")


def granted() -> set[tuple[str, str, str]]:
    """What rbac.yaml grants, as (verb, resource, namespace) ("" for cluster-wide)."""
    rules: set[tuple[str, str, str]] = set()
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        ns = doc["metadata"].get("namespace", "") if doc["kind"] == "Role" else ""
        for rule in doc["rules"]:
            assert rule["apiGroups"] in ([""], ["coordination.k8s.io"]), rule
            for resource in rule["resources"]:
                rules.update((verb, resource, ns) for verb in rule["verbs"])
    return rules


@pytest.fixture
def sa_client(kube_api: KubeApi, kube_nodes: KubeNodes) -> kclient.ApiClient:
    """An ApiClient with the coordinator ServiceAccount's token, rbac.yaml applied."""
    token = kube_api.service_account_token(SA_NAMESPACE, SA_NAME)
    kube_api.kubectl("apply", "-f", str(RBAC))
    c = kube_api.token_client(token)
    core = kclient.CoreV1Api(c)

    leases = kclient.CoordinationV1Api(c)

    def allowed() -> bool:  # RBAC changes reach the authorizer through a watch: wait for it
        try:
            core.list_node()
            core.list_namespaced_pod(kube_nodes.namespace)
            leases.read_namespaced_lease("recover-absent", SA_NAMESPACE)
        except ApiException as e:
            if e.status == 404:  # allowed to look: there is none
                return True
            if e.status == 403:
                return False
            raise
        return True

    wait_for(allowed, 30, "rbac.yaml in effect")
    return c


def test_every_adapter_operation_succeeds_with_exactly_the_granted_verbs(
    kube_api: KubeApi, kube_nodes: KubeNodes, sa_client: kclient.ApiClient
) -> None:
    t = Recording(sa_client)
    base = KubeSettings(namespace=kube_nodes.namespace, pod_selector=kube_nodes.selector,
                        watch_timeout_s=1)  # fmt: skip
    ctl = KubeControl(t, base)
    assert {n.name for n in ctl.nodes()} == set(kube_nodes.all)
    assert ctl.mark_unhealthy("node1", "xid79", "inc-1")
    assert ctl.clear_marks("node1")
    assert ctl.retire_spare("spare1")
    assert ctl.promote_spare("spare1")
    assert ctl.request_operator_drain("node2", "inc-2") == ["slurmd-node2"]
    assert ctl.withdraw_operator_drain("node2") == ["slurmd-node2"]
    assert ctl.delete_slurmd_pods("node2") == ["slurmd-node2"]
    evict = KubeSettings(namespace=kube_nodes.namespace, pod_selector=kube_nodes.selector,
                         pod_removal="evict")  # fmt: skip
    assert KubeControl(t, evict).delete_slurmd_pods("node3") == ["slurmd-node3"]
    assert gone_or_terminating(kube_api, kube_nodes.namespace, "slurmd-node3")
    with Watching(ctl) as w:
        # The list, then at least one watch request answered.
        wait_for(lambda: ("watch", "nodes", "") in t.used and w.matching(lambda _n: True),
                 15, "the watch running")  # fmt: skip
    # The leader election's Lease, in the coordinator's own namespace.
    lease = KubeLease(t, SA_NAMESPACE, f"recover-rbac-{uuid.uuid4().hex[:8]}")
    try:
        assert lease.read() is None
        taken = lease.create("replica-a", 6, 1_800_000_000.0)
        assert lease.update(taken, "replica-a", 1, 6, 1_800_000_001.0).holder == "replica-a"
    finally:
        kube_api.kubectl("delete", "lease", lease.name, "-n", SA_NAMESPACE, "--ignore-not-found")
    used = {u for u in t.used if u[0] != "discovery"}
    assert used == granted()  # nothing granted that the adapters do not use, and vice versa


def test_what_the_coordinator_must_not_do_is_forbidden(
    kube_api: KubeApi, kube_nodes: KubeNodes, sa_client: kclient.ApiClient
) -> None:
    core = kclient.CoreV1Api(sa_client)
    leases = kclient.CoordinationV1Api(sa_client)
    admin = kclient.CoreV1Api(kube_api.admin_client())
    kube_api.ensure_namespace("other")
    pod = kclient.V1Pod(
        metadata=kclient.V1ObjectMeta(name="web"),
        spec=kclient.V1PodSpec(containers=[kclient.V1Container(name="web", image="web:1")]),
    )
    create_or_keep(admin.create_namespaced_pod, "other", pod)
    refusals: dict[str, Callable[[], object]] = {
        "read secrets": lambda: core.list_namespaced_secret(SA_NAMESPACE),
        "read secrets anywhere": lambda: core.list_secret_for_all_namespaces(),
        "delete a node": lambda: core.delete_node("node1"),
        "patch a pod elsewhere": lambda: core.patch_namespaced_pod(
            "web", "other", {"metadata": {"labels": {"x": "y"}}}
        ),
        "delete a pod elsewhere": lambda: core.delete_namespaced_pod("web", "other"),
        "update a node": lambda: core.replace_node("node1", admin.read_node("node1")),
        "read leases elsewhere": lambda: leases.list_namespaced_lease("other"),
        "delete the lease": lambda: leases.delete_namespaced_lease("recover-x", SA_NAMESPACE),
    }
    for what, call in refusals.items():
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403, what
    names = {n["metadata"]["name"] for n in kube_api.raw(admin.list_node())["items"]}
    assert "node1" in names  # not deleted
    # The adapter pointed at another namespace says which permission is missing, and where.
    ctl = KubeControl(Transport(sa_client), KubeSettings(namespace="other"))
    with pytest.raises(KubeForbiddenError, match=r"list pods in other: forbidden \(403\)") as e:
        ctl.delete_slurmd_pods("node1")
    assert "k8s/deploy/rbac.yaml" in str(e.value)


def test_an_unbound_service_account_gets_a_verdict_not_retries(
    kube_api: KubeApi, kube_nodes: KubeNodes, sa_client: kclient.ApiClient
) -> None:
    # Authenticated, but no binding: every request is refused, and a refusal is not retried.
    stranger = kube_api.token_client(kube_api.service_account_token(SA_NAMESPACE, "stranger"))
    t = Recording(stranger)
    ctl = KubeControl(t, KubeSettings(namespace=kube_nodes.namespace))
    with pytest.raises(KubeForbiddenError, match=r"get nodes node1: forbidden \(403\)"):
        ctl.mark_unhealthy("node1", "xid79", "inc-3")
    assert t.used == {("get", "nodes", "")}
