"""``KubeControl``: the :class:`recovery.ports.nodes.NodeControl` port over the Kubernetes API.

Node changes are read-modify-write: the patch carries the resourceVersion it was computed
from, a 409 means someone wrote in between, and the change is recomputed from a fresh read
(``conflict_retries`` times). Conditions go through the status subresource (a status sent with
an ordinary node patch is silently dropped). The verbs used here are exactly those granted in
k8s/deploy/rbac.yaml: nodes get/list/watch/patch, nodes/status patch, pods list/delete/patch
and pods/eviction create in the slurmd namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from k8s.parse import (
    Obj,
    SlurmdPod,
    clear_patch,
    condition_patch,
    condition_removal,
    labels_patch,
    mark_patch,
    name_of,
    parse_node,
    parse_pod,
    parse_watch_line,
    pod_cordon_patch,
    pod_uncordon_patch,
    resource_version,
)
from k8s.transport import MERGE_PATCH, STRATEGIC_PATCH, Conflict, Transport
from recovery.errors import (
    KubeNotFoundError,
    KubeRefusedError,
    KubeUnavailableError,
    unknown_choice,
)
from recovery.ports.nodes import PROMOTED_LABEL, SPARE_LABEL, TAINT_EFFECTS, KubeNode

POD_REMOVALS = ("delete", "evict")


@dataclass(frozen=True)
class KubeSettings:
    """Where the slurmd pods are and how we mark nodes."""

    namespace: str = "slurm"
    """Namespace of the slurmd pods."""
    pod_selector: str = "app.kubernetes.io/component=slurmd"
    """Label selector that finds slurmd pods (with ``spec.nodeName`` for one node's)."""
    taint_effect: str = "NoSchedule"
    """Our taint's effect: NoSchedule, or NoExecute (also evicts pods that do not tolerate it)."""
    pod_removal: str = "delete"
    """``delete`` (preferred: no PodDisruptionBudget can hold a failed node's pod) or
    ``evict`` through the Eviction API (policy/v1, or policy/v1beta1 on older servers)."""
    grace_s: int | None = None
    """Grace period for deleting a slurmd pod, in seconds; None: the pod's own."""
    timeout_s: float = 10.0
    """Seconds to connect, and to wait for each answer."""
    conflict_retries: int = 5
    """Fresh reads after a 409 before giving up with KubeRefusedError."""
    watch_timeout_s: int = 5
    """Seconds one watch request lasts; ``stop`` is checked at least this often."""

    def __post_init__(self) -> None:
        if self.taint_effect not in TAINT_EFFECTS:
            raise unknown_choice("taint effect", self.taint_effect, TAINT_EFFECTS)
        if self.pod_removal not in POD_REMOVALS:
            raise unknown_choice("pod removal", self.pod_removal, POD_REMOVALS)


class KubeControl:
    """NodeControl through one API server (``transport``); ``clock`` gives wall seconds for
    condition timestamps."""

    def __init__(
        self,
        transport: Transport,
        settings: KubeSettings = KubeSettings(),  # frozen, one shared default is safe
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.t = transport
        self.settings = settings
        self.clock = clock
        self._eviction_version: str | None = None

    # --- reading ------------------------------------------------------------------------

    def _node(self, name: str) -> dict[str, Any]:
        return self.t.request("GET", f"/api/v1/nodes/{name}", what=f"get nodes {name}")

    def _pods(self, node: str | None = None) -> list[SlurmdPod]:
        ns = self.settings.namespace
        query: list[tuple[str, str | int | bool]] = [("labelSelector", self.settings.pod_selector)]
        if node is not None:
            query.append(("fieldSelector", f"spec.nodeName={node}"))
        found = self.t.request(
            "GET", f"/api/v1/namespaces/{ns}/pods", what=f"list pods in {ns}", query=query
        )
        return sorted((parse_pod(p) for p in found.get("items") or []), key=lambda p: p.name)

    def nodes(self) -> list[KubeNode]:
        """Every node with its slurmd pods, sorted by name."""
        listed = self.t.request("GET", "/api/v1/nodes", what="list nodes")
        by_node: dict[str, list[SlurmdPod]] = {}
        for pod in self._pods():
            by_node.setdefault(pod.node, []).append(pod)
        nodes = [parse_node(o, by_node.get(name_of(o), ())) for o in listed.get("items") or []]
        return sorted(nodes, key=lambda n: n.name)

    # --- node writes ----------------------------------------------------------------------

    def _update(
        self, node: str, change: Callable[[Obj], dict[str, Any] | None], *, missing_ok: bool
    ) -> tuple[bool, dict[str, Any] | None]:
        """Apply ``change`` (read -> merge patch or None) until it sticks; (changed, node)."""
        for _ in range(self.settings.conflict_retries + 1):
            try:
                obj = self._node(node)
            except KubeNotFoundError:
                if missing_ok:
                    return False, None
                raise
            patch = change(obj)
            if patch is None:
                return False, obj
            try:
                done = self.t.request(
                    "PATCH", f"/api/v1/nodes/{node}", what=f"patch nodes {node}",
                    body=patch, content_type=MERGE_PATCH,
                )  # fmt: skip
            except Conflict:
                continue  # written by someone in between: recompute from a fresh read
            except KubeNotFoundError:
                if missing_ok:
                    return False, None
                raise
            return True, done
        raise KubeRefusedError(
            f"patch nodes {node}: still conflicting after {self.settings.conflict_retries} "
            "fresh reads; another writer keeps changing the node"
        )

    def _status(self, node: str, patch: dict[str, Any] | None, *, missing_ok: bool) -> bool:
        if patch is None:
            return False
        try:
            self.t.request(
                "PATCH", f"/api/v1/nodes/{node}/status", what=f"patch nodes/status {node}",
                body=patch, content_type=STRATEGIC_PATCH,
            )  # fmt: skip
        except KubeNotFoundError:
            if missing_ok:
                return False
            raise
        return True

    def mark_unhealthy(self, node: str, fault: str, incident: str) -> bool:
        """Cordon, taint, annotate, condition. KubeNotFoundError when the node does not exist."""
        effect = self.settings.taint_effect
        changed, obj = self._update(
            node, lambda o: mark_patch(o, fault, incident, effect), missing_ok=False
        )
        assert obj is not None  # missing_ok=False: a missing node raised
        cond = condition_patch(obj, fault, incident, self.clock())
        return self._status(node, cond, missing_ok=False) or changed

    def clear_marks(self, node: str) -> bool:
        """Remove what is ours; a node that is gone is done."""
        changed, obj = self._update(node, clear_patch, missing_ok=True)
        if obj is None:
            return changed
        return self._status(node, condition_removal(obj), missing_ok=True) or changed

    def promote_spare(self, node: str) -> bool:
        changed, _ = self._update(
            node, lambda o: labels_patch(o, {PROMOTED_LABEL: "true"}, [SPARE_LABEL]),
            missing_ok=False,
        )  # fmt: skip
        return changed

    def retire_spare(self, node: str) -> bool:
        changed, _ = self._update(
            node, lambda o: labels_patch(o, {SPARE_LABEL: "true"}, [PROMOTED_LABEL]),
            missing_ok=False,
        )  # fmt: skip
        return changed

    # --- pods -----------------------------------------------------------------------------

    def delete_slurmd_pods(self, node: str) -> list[str]:
        """Delete (or evict) the slurmd pods on ``node``; pods already terminating or gone
        are done. An eviction a PodDisruptionBudget refuses (429) is KubeUnavailableError:
        retried later."""
        removed = []
        for pod in self._pods(node):
            if pod.terminating:
                continue
            try:
                if self.settings.pod_removal == "evict":
                    self._evict(pod.name)
                else:
                    self._delete(pod.name)
            except KubeNotFoundError:
                continue  # gone in between: what we wanted
            removed.append(pod.name)
        return removed

    def _delete(self, pod: str) -> None:
        ns = self.settings.namespace
        query: list[tuple[str, str | int | bool]] = []
        if self.settings.grace_s is not None:
            query.append(("gracePeriodSeconds", self.settings.grace_s))
        self.t.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}", what=f"delete pods {ns}/{pod}",
            query=query,
        )  # fmt: skip

    def eviction_version(self) -> str:
        """``policy/v1`` when the server serves it (Kubernetes 1.22+), else ``policy/v1beta1``;
        asked once."""
        if self._eviction_version is None:
            group = self.t.request("GET", "/apis/policy", what="get /apis/policy")
            versions = {str(v.get("version")) for v in group.get("versions") or []}
            self._eviction_version = "policy/v1" if "v1" in versions else "policy/v1beta1"
        return self._eviction_version

    def _evict(self, pod: str) -> None:
        ns = self.settings.namespace
        body: dict[str, Any] = {
            "apiVersion": self.eviction_version(),
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": ns},
        }
        if self.settings.grace_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": self.settings.grace_s}
        try:
            self.t.request(
                "POST", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction",
                what=f"create pods/eviction {ns}/{pod}", body=body,
            )  # fmt: skip
        except Conflict as e:  # the pod changed under the eviction: try on the next tick
            raise KubeUnavailableError(f"evict {ns}/{pod}: conflict; will retry") from e

    def _annotate_pods(
        self, node: str, patch_for: Callable[[SlurmdPod], dict[str, Any] | None]
    ) -> list[str]:
        ns = self.settings.namespace
        changed = []
        for pod in self._pods(node):
            patch = patch_for(pod)
            if patch is None:
                continue
            try:
                self.t.request(
                    "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod.name}",
                    what=f"patch pods {ns}/{pod.name}", body=patch, content_type=MERGE_PATCH,
                )  # fmt: skip
            except KubeNotFoundError:
                continue
            changed.append(pod.name)
        return changed

    def request_operator_drain(self, node: str, incident: str) -> list[str]:
        return self._annotate_pods(node, lambda p: pod_cordon_patch(p, incident))

    def withdraw_operator_drain(self, node: str) -> list[str]:
        return self._annotate_pods(node, pod_uncordon_patch)

    # --- watching -------------------------------------------------------------------------

    def watch(self, stop: Callable[[], bool]) -> Iterator[KubeNode]:
        """List, then watch from the list's resourceVersion; an expired one (410) lists again."""
        version: str | None = None
        while not stop():
            if version is None:
                listed = self.t.request("GET", "/api/v1/nodes", what="list nodes")
                version = resource_version(listed)
                for obj in listed.get("items") or []:
                    yield parse_node(obj)
                continue
            version = yield from self._watch_once(version, stop)

    def _watch_once(
        self, version: str, stop: Callable[[], bool]
    ) -> Generator[KubeNode, None, str | None]:
        """One watch request; returns the resourceVersion to go on from (None: list again)."""
        timeout = self.settings.watch_timeout_s
        query: list[tuple[str, str | int | bool]] = [
            ("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", timeout),
            ("allowWatchBookmarks", "true"),
        ]  # fmt: skip
        try:
            lines = self.t.lines(
                "/api/v1/nodes", what="watch nodes", query=query,
                read_timeout_s=timeout + self.settings.timeout_s,
            )  # fmt: skip
            for line in lines:
                kind, obj = parse_watch_line(line)
                if kind == "ERROR":
                    if obj.get("code") == 410:  # too old: the server forgot; list again
                        return None
                    raise KubeRefusedError(f"watch nodes: {obj.get('message', obj)}")
                version = resource_version(obj) or version
                if kind in ("ADDED", "MODIFIED"):
                    yield parse_node(obj)
                if stop():
                    break
        except KubeRefusedError as e:
            if "(410)" in str(e):
                return None
            raise
        return version
