"""The adapter against the real API server when others write too: a real 409 retried with a
fresh read, and the node watch turning NotReady and Unknown into health events."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as kclient

from k8s.nodes import KubeControl, KubeSettings
from k8s.transport import Conflict, Query, Transport
from recovery.coordinator.kube import unready_event
from recovery.errors import KubeRefusedError
from recovery.model import HealthEvent, Source
from recovery.model.events import UNREACHABLE
from recovery.ports.nodes import TAINT_KEY, KubeNode
from tests.k8s.helpers import Watching, control, node_json, taints
from tests.plugins.kube_api import KubeApi, KubeNodes
from tests.slurm.helpers import wait_for

pytestmark = pytest.mark.kube


class Interfering(Transport):
    """After each of the first ``times`` reads of a node, another client relabels that node,
    so the patch computed from the read carries a stale resourceVersion. Records every request
    with its outcome."""

    def __init__(self, api: kclient.ApiClient, other: kclient.CoreV1Api, times: int) -> None:
        super().__init__(api, timeout_s=10.0)
        self.other = other
        self.left = times
        self.log: list[tuple[str, str, str]] = []

    def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            got = super().request(method, path, **kw)
        except Conflict:
            self.log.append((method, path, "409"))
            raise
        self.log.append((method, path, "ok"))
        if method == "GET" and path.startswith("/api/v1/nodes/") and self.left > 0:
            self.left -= 1
            name = path.rsplit("/", 1)[1]
            self.other.patch_node(name, {"metadata": {"labels": {"writer": f"w{self.left}"}}})
        return got


def _interfering(kube: KubeApi, layout: KubeNodes, times: int) -> tuple[KubeControl, Interfering]:
    t = Interfering(kube.admin_client(), kclient.CoreV1Api(kube.admin_client()), times)
    return KubeControl(t, KubeSettings(namespace=layout.namespace, pod_selector=layout.selector)), t


def test_a_conflict_is_retried_with_a_fresh_read(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    ctl, t = _interfering(kube_api, kube_nodes, times=1)
    assert ctl.mark_unhealthy("node1", "xid79", "inc-1") is True
    patches = [(m, outcome) for m, p, outcome in t.log if p == "/api/v1/nodes/node1" and m != "GET"]
    assert patches == [("PATCH", "409"), ("PATCH", "ok")]
    obj = node_json(kube_api, "node1")
    assert obj["metadata"]["labels"]["writer"] == "w0"  # the other writer's change survived
    assert taints(obj) == [{"key": TAINT_KEY, "value": "xid79", "effect": "NoSchedule"}]


def test_endless_conflicts_end_in_a_verdict(kube_api: KubeApi, kube_nodes: KubeNodes) -> None:
    ctl, t = _interfering(kube_api, kube_nodes, times=100)
    with pytest.raises(KubeRefusedError, match="still conflicting after 5 fresh reads"):
        ctl.retire_spare("spare1")
    assert [o for m, _p, o in t.log if m == "PATCH"] == ["409"] * 6


class CountingWatches(Transport):
    """Counts the watch requests made (each lasts ``watch_timeout_s``)."""

    watches = 0

    def lines(self, path: str, *, what: str, query: Query, read_timeout_s: float) -> Iterator[str]:
        type(self).watches += 1
        return super().lines(path, what=what, query=query, read_timeout_s=read_timeout_s)


def _events(seen: list[KubeNode], node: str) -> list[HealthEvent]:
    got = (unready_event(n, time.time()) for n in list(seen) if n.name == node)
    return [e for e in got if e is not None]


@pytest.mark.slow
def test_the_watch_turns_notready_and_unknown_into_events(
    kube_api: KubeApi, kube_nodes: KubeNodes
) -> None:
    CountingWatches.watches = 0
    ctl = control(kube_api.admin_client(), kube_nodes, transport=CountingWatches,
                  watch_timeout_s=1)  # fmt: skip
    with Watching(ctl) as w:
        wait_for(lambda: {n.name for n in w.matching(lambda _n: True)} >= set(kube_nodes.all),
                 10, "every node listed")  # fmt: skip
        assert not [n for n in w.seen if unready_event(n, time.time())]
        # A second watch request means the first one ended and the watch went on from its
        # resourceVersion: what comes now arrives through a resumed watch.
        wait_for(lambda: CountingWatches.watches >= 2, 10, "a resumed watch")
        kube_api.set_node_ready("node2", "False", reason="KubeletNotReady")
        (down,) = wait_for(lambda: _events(w.seen, "node2"), 15, "node2's NotReady event")
        kube_api.set_node_ready("node3", "Unknown", reason="NodeStatusUnknown")
        (lost,) = wait_for(lambda: _events(w.seen, "node3"), 15, "node3's Unknown event")
    assert (down.fault, down.source, down.node) == (UNREACHABLE, Source.k8s, "node2")
    assert down.id.startswith("k8s-node2-ready-false-")
    assert down.message == "Kubernetes reports node2 Ready=False: KubeletNotReady"
    assert lost.id.startswith("k8s-node3-ready-unknown-")
    # A new watch (a restarted coordinator) lists the same outage: the same event id.
    with Watching(control(kube_api.admin_client(), kube_nodes, watch_timeout_s=1)) as again:
        (seen_again,) = wait_for(lambda: _events(again.seen, "node2"), 10, "node2 listed")
    assert seen_again.id == down.id
    kube_api.set_node_ready("node2", "True")
    assert unready_event(KubeNode("node2", ready="True"), time.time()) is None
