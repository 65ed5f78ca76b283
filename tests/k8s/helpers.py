"""Helpers of the Kubernetes adapter's real-server tests: building the adapter for a client,
reading objects back as the API's JSON, and a watch running on a thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as kclient

from k8s.nodes import KubeControl, KubeSettings
from k8s.transport import Transport
from recovery.ports.nodes import KubeNode
from tests.plugins.kube_api import KubeApi, KubeNodes


def control(
    api: kclient.ApiClient, layout: KubeNodes, *, transport: type[Transport] = Transport,
    **settings: Any,
) -> KubeControl:  # fmt: skip
    """The adapter over ``api`` for the slurmd pods ``layout`` registered."""
    given: dict[str, Any] = {"namespace": layout.namespace, "pod_selector": layout.selector}
    kube = KubeSettings(**{**given, **settings})
    return KubeControl(transport(api, timeout_s=10.0), kube)


def node_json(kube: KubeApi, name: str) -> dict[str, Any]:
    """Node ``name`` as the API's JSON (read as the admin)."""
    core = kclient.CoreV1Api(kube.admin_client())
    got: dict[str, Any] = kube.raw(core.read_node(name))
    return got


def pod_json(kube: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    """Pod ``namespace/name`` as JSON, None when it is gone."""
    core = kclient.CoreV1Api(kube.admin_client())
    try:
        got: dict[str, Any] = kube.raw(core.read_namespaced_pod(name, namespace))
    except kclient.ApiException as e:
        if e.status == 404:
            return None
        raise
    return got


def gone_or_terminating(kube: KubeApi, namespace: str, name: str) -> bool:
    """The pod was deleted: gone, or (no kubelet confirms a graceful delete) terminating."""
    pod = pod_json(kube, namespace, name)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


def taints(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's taints but Kubernetes' own (``node.kubernetes.io/not-ready``: the server
    adds it to every new Node, and no controller runs here to take it off)."""
    return [
        {k: t.get(k) for k in ("key", "value", "effect")}
        for t in obj["spec"].get("taints") or []
        if not str(t.get("key")).startswith("node.kubernetes.io/")
    ]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == kind), None)


@dataclass
class Watching:
    """:meth:`KubeControl.watch` on a thread, collecting what it yields until stopped."""

    control: KubeControl
    seen: list[KubeNode] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watching:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for node in self.control.watch(self._stop.is_set):
                self.seen.append(node)
        except BaseException as e:  # handed to the test, which fails on it
            self.errors.append(e)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)
        assert not self._thread.is_alive(), "the watch did not stop"

    def matching(self, pred: Callable[[KubeNode], bool]) -> list[KubeNode]:
        assert not self.errors, self.errors
        return [n for n in list(self.seen) if pred(n)]
