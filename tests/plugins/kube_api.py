"""One real local Kubernetes API server per test session (etcd + kube-apiserver v1.20.2, RBAC on).

A plugin (registered in tests/conftest.py). The server is started by the first test that asks
for it and stopped at the end of the session, checking that no process is left behind. The
binaries come from ``./scripts/build-kube.sh`` (cached; ``./scripts/setup.sh`` runs it); without
them the tests skip saying so (in CI, where ``$CI`` is set, they fail instead).

Fixtures
--------
``kube_api`` (session): a :class:`KubeApi`:

* ``admin_client()`` -> ``kubernetes.client.ApiClient`` as the admin (``system:masters``);
* ``token_client(token)`` -> ``ApiClient`` authenticating with a bearer token (e.g. a
  ServiceAccount's; RBAC applies, so a missing permission is a 403 ``ApiException``);
* ``service_account_token(namespace, name)`` -> a token from the TokenRequest API, creating
  the namespace and ServiceAccount when absent;
* ``kubeconfig`` (admin's, a Path), ``write_kubeconfig(path, token)`` for another identity;
* ``url``, ``ca_cert``, ``kubectl(*args)`` (the built kubectl, as the admin, output captured);
* ``raw(obj)``: a client model as the API's JSON (dicts, camelCase keys): the client's models
  type every field as optional, which is noisy in tests;
* ``register(nodes, spares=(), spare_labels={})`` / ``reset()``: what the per-test fixtures use;
* ``set_node_ready(name, "True"|"False"|"Unknown")``: rewrites the Ready condition, as a
  kubelet (or its absence) would - no kubelet or controller-manager runs here.

``kube_nodes`` (per test): Node objects ``node1..node3`` and ``spare1`` (the session Slurm
cluster's layout, without starting Slurm) and one slurmd pod per node in namespace ``slurm``.
``kube_slurm_nodes`` (per test): the same for the running session Slurm cluster's own node
names (it starts that cluster). Both give a :class:`KubeNodes` and reset the server before and
after the test: every Node and every Pod (in any namespace) is deleted, then the layout is
registered afresh - so a test may cordon, taint, relabel or delete freely. Namespaces,
ServiceAccounts and RBAC objects are kept for the session (nothing could finalize a deleted
namespace), so create those idempotently.

Nodes get the labels ``kubernetes.io/hostname=<name>`` and ``kubernetes.io/os=linux`` and a
``Ready=True`` condition. Pods are named ``slurmd-<node>``, carry ``SLURMD_LABELS`` (select
them with ``SLURMD_SELECTOR``), have ``spec.nodeName`` bound and stay Pending. Without a
kubelet a graceful delete of a bound pod only sets ``deletionTimestamp``; it disappears at once
with ``grace_period_seconds=0``.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kclient
from kubernetes.client import ApiException

from k8s.localapi import (
    ApiServerInfo,
    KubeBinaries,
    KubeNotBuiltError,
    LocalApiServer,
    find_binaries,
    write_kubeconfig,
)
from slurm.cluster import ClusterInfo, node_names
from tests.slurm.helpers import wait_for

NAMESPACE = "slurm"
SLURMD_LABELS = {"app.kubernetes.io/name": "slurm", "app.kubernetes.io/component": "slurmd"}
SLURMD_SELECTOR = "app.kubernetes.io/component=slurmd"


@dataclass(frozen=True)
class KubeNodes:
    """What a per-test fixture registered."""

    namespace: str
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    pods: dict[str, str] = field(default_factory=dict)
    """Node name -> its slurmd pod's name (in ``namespace``)."""
    selector: str = SLURMD_SELECTOR

    @property
    def all(self) -> tuple[str, ...]:
        return self.nodes + self.spares


class KubeApi:
    """The session's API server, as tests use it (see the module docstring)."""

    def __init__(self, server: LocalApiServer, info: ApiServerInfo, bins: KubeBinaries) -> None:
        self.server = server
        self.info = info
        self.binaries = bins
        self._clients: list[kclient.ApiClient] = []
        self._admin = self.admin_client()

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def ca_cert(self) -> Path:
        return self.info.ca_cert

    @property
    def kubeconfig(self) -> Path:
        return self.info.kubeconfig

    def admin_client(self) -> kclient.ApiClient:
        """A new ApiClient as the admin; closed at the end of the session."""
        return self.token_client(self.info.admin_token)

    def token_client(self, token: str) -> kclient.ApiClient:
        """A new ApiClient for bearer ``token``; closed at the end of the session."""
        c = self.info.client(token)
        self._clients.append(c)
        return c

    def write_kubeconfig(self, path: Path, token: str) -> Path:
        return write_kubeconfig(
            path, server=self.url, ca_cert=self.ca_cert, token=token, user="token"
        )

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl as the admin; text output captured. With ``check`` a non-zero
        exit fails the test showing stderr."""
        argv = [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def ensure_namespace(self, name: str) -> None:
        body = kclient.V1Namespace(metadata=kclient.V1ObjectMeta(name=name))
        create_or_keep(kclient.CoreV1Api(self._admin).create_namespace, body)

    def service_account_token(self, namespace: str, name: str, expiration_s: int = 3600) -> str:
        """A token for ServiceAccount ``namespace/name`` (created with its namespace when
        absent) from the TokenRequest API, valid ``expiration_s`` seconds."""
        core = kclient.CoreV1Api(self._admin)
        self.ensure_namespace(namespace)
        sa = kclient.V1ServiceAccount(metadata=kclient.V1ObjectMeta(name=name))
        create_or_keep(core.create_namespaced_service_account, namespace, sa)
        req = kclient.AuthenticationV1TokenRequest(
            spec=kclient.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_s)
        )
        got = self.raw(core.create_namespaced_service_account_token(name, namespace, req))
        token: str = got["status"]["token"]
        return token

    def raw(self, obj: object) -> Any:
        """A client model (or list of them) as the API's JSON: dicts with camelCase keys,
        so a test reads ``raw(node)["spec"].get("unschedulable")`` without None checks."""
        return self._admin.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]

    def register(
        self,
        nodes: Sequence[str],
        spares: Sequence[str] = (),
        *,
        namespace: str = NAMESPACE,
        spare_labels: Mapping[str, str] | None = None,
    ) -> KubeNodes:
        """Create a Ready Node per name and a bound slurmd pod per node (spares included);
        ``spare_labels`` go on the spares' Nodes."""
        core = kclient.CoreV1Api(self._admin)
        self.ensure_namespace(namespace)
        pods = {}
        for name in (*nodes, *spares):
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
            if name in spares:
                labels.update(spare_labels or {})
            meta = kclient.V1ObjectMeta(name=name, labels=labels)
            core.create_node(kclient.V1Node(metadata=meta))
            self.set_node_ready(name, "True")
            pod = kclient.V1Pod(
                metadata=kclient.V1ObjectMeta(name=f"slurmd-{name}", labels=dict(SLURMD_LABELS)),
                spec=kclient.V1PodSpec(
                    node_name=name,
                    containers=[kclient.V1Container(name="slurmd", image="slurmd:test")],
                ),
            )
            core.create_namespaced_pod(namespace, pod)
            pods[name] = f"slurmd-{name}"
        return KubeNodes(namespace, tuple(nodes), tuple(spares), pods)

    def set_node_ready(self, name: str, status: str, reason: str = "KubeletReady") -> None:
        """Set node ``name``'s Ready condition to ``status`` (``True``, ``False``, ``Unknown``)
        through the status subresource, with fresh heartbeat times."""
        if status not in ("True", "False", "Unknown"):
            raise ValueError(f"status {status!r}: expected True, False or Unknown")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {"type": "Ready", "status": status, "reason": reason, "message": reason,
                "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        kclient.CoreV1Api(self._admin).patch_node_status(name, {"status": {"conditions": [cond]}})

    def reset(self) -> None:
        """Delete every Pod (at once, grace 0, finalizers dropped) and every Node; return once
        none is left."""
        core = kclient.CoreV1Api(self._admin)
        for pod in self.raw(core.list_pod_for_all_namespaces())["items"]:
            meta = pod["metadata"]
            ns, name = meta["namespace"], meta["name"]
            if meta.get("finalizers"):
                _gone_ok(core.patch_namespaced_pod, name, ns, {"metadata": {"finalizers": None}})
            _gone_ok(core.delete_namespaced_pod, name, ns, grace_period_seconds=0)
        for node in self.raw(core.list_node())["items"]:
            _gone_ok(core.delete_node, node["metadata"]["name"])

        def empty() -> bool:
            return not core.list_pod_for_all_namespaces().items and not core.list_node().items

        wait_for(empty, 30, "every Pod and Node deleted")

    def close(self) -> None:
        for c in self._clients:
            c.close()  # type: ignore[no-untyped-call]
        self._clients.clear()


def create_or_keep(create: Callable[..., object], *args: object) -> None:
    """``create(*args)``; an AlreadyExists (409) means it is there, which is what we want."""
    try:
        create(*args)
    except ApiException as e:
        if e.status != 409:
            raise


def _gone_ok(call: Callable[..., object], *args: object, **kwargs: object) -> None:
    """``call(*args, **kwargs)``; a 404 means it is already gone, which is what we want."""
    try:
        call(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    """The session's running API server; stopped at the end, checking nothing is left."""
    try:
        bins = find_binaries()
    except KubeNotBuiltError as e:
        if os.environ.get("CI"):
            # .ci/run builds them (setup.sh); a silent skip there would hide the whole tier.
            pytest.fail(f"Kubernetes tier cannot run in CI: {e}")
        pytest.skip(f"Kubernetes tier skipped: {e}")
    server = LocalApiServer(tmp_path_factory.mktemp("kube-api"), binaries=bins)
    info = server.start()
    api = KubeApi(server, info, bins)
    try:
        yield api
    finally:
        api.close()
        server.stop()
        left = server.processes()
        assert not left, f"processes left behind after the API server stopped: {sorted(left)}"


def _registered(api: KubeApi, nodes: Sequence[str], spares: Sequence[str]) -> Iterator[KubeNodes]:
    api.reset()
    yield api.register(nodes, spares)
    api.reset()


@pytest.fixture
def kube_nodes(kube_api: KubeApi) -> Iterator[KubeNodes]:
    """Nodes node1..node3 + spare1 and their slurmd pods; no Slurm needed."""
    nodes, spares = node_names(3, 1)
    yield from _registered(kube_api, nodes, spares)


@pytest.fixture
def kube_slurm_nodes(kube_api: KubeApi, cluster_info: ClusterInfo) -> Iterator[KubeNodes]:
    """Nodes named after the running session Slurm cluster's nodes and spares."""
    yield from _registered(kube_api, cluster_info.nodes, cluster_info.spares)
