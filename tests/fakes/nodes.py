"""An in-memory NodeControl for unit tests of the coordinator's Kubernetes steps. A fake of our
own port, never the proof that the adapter works (tests/k8s does that on a real API server).

Our rules are not copied here. The fake keeps Node and Pod objects as the API's JSON and
changes them only with the patches ``k8s.parse`` computes for the real adapter (``mark_patch``,
``clear_patch``, ``labels_patch``, ``condition_patch``, ``condition_removal``,
``pod_cordon_patch``, ``pod_uncordon_patch``), applied as the API server applies them; what
it hands out is ``k8s.parse.parse_node`` of those objects. So what we write, what we leave
to other owners and when an action is a no-op are decided by the same code as in
``k8s.nodes``; tests/k8s/test_fake_contract.py runs the same cases against this fake and the
real adapter on a real API server.

What the fake adds: a slurmd pod deleted is gone at once (a kubelet that confirmed it),
``unavailable`` fails the next calls transiently, ``forbidden`` refuses named methods as RBAC
would. Every call that changed something is logged in :attr:`FakeNodes.calls`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from k8s.parse import (
    SlurmdPod,
    clear_patch,
    condition_patch,
    condition_removal,
    labels_patch,
    mark_patch,
    parse_node,
    parse_pod,
    pod_cordon_patch,
    pod_uncordon_patch,
    resource_version,
)
from recovery.errors import (
    KubeForbiddenError,
    KubeNotFoundError,
    KubeRefusedError,
    KubeUnavailableError,
)
from recovery.ports.nodes import PROMOTED_LABEL, SPARE_LABEL, KubeNode

Obj = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` as a JSON merge patch (RFC 7386): objects merge, None
    removes a key, anything else replaces. Neither argument is changed."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def merge_conditions(conditions: Sequence[Obj], patch: Sequence[Obj]) -> list[Obj]:
    """A strategic merge patch of ``status.conditions`` (merged by ``type``; an entry with
    ``$patch: delete`` removes that type)."""
    out = [dict(c) for c in conditions]
    for change in patch:
        kind = change.get("type")
        at = next((i for i, c in enumerate(out) if c.get("type") == kind), None)
        if change.get("$patch") == "delete":
            if at is not None:
                del out[at]
        elif at is None:
            out.append(dict(change))
        else:
            out[at] = {**out[at], **change}
    return out


class FakeNodes:
    """Kubernetes nodes named like the Slurm ones, each Ready with one slurmd pod
    ``slurmd-NAME``; our taint's effect is ``taint_effect`` (the adapter's setting)."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        taint_effect: str = "NoSchedule",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.taint_effect = taint_effect
        self._clock = clock
        self._version = 0
        self._nodes: dict[str, Obj] = {}
        self._pods: dict[str, Obj] = {}
        for n in names:
            self._nodes[n] = {
                "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            self._bump(self._nodes[n])
            pod = f"slurmd-{n}"
            self._pods[pod] = {"metadata": {"name": pod}, "spec": {"nodeName": n}}
        self.calls: list[tuple[str, ...]] = []
        self.unavailable = 0
        """Fail this many next calls with KubeUnavailableError (an API server outage)."""
        self.forbidden: set[str] = set()
        """Method names that raise as if RBAC refused them."""

    # --- test controls: someone else, the kubelet -------------------------------------------

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        """Someone else's JSON merge patch of Node ``name`` (``kubectl cordon``, an operator's
        taint, label or annotation)."""
        self._nodes[name] = self._bump(merge_patch(self._get(name), patch))

    def patch_pod(self, name: str, patch: Mapping[str, Any]) -> None:
        """Someone else's JSON merge patch of pod ``name`` (e.g. Slinky's pod-cordon)."""
        self._pods[name] = merge_patch(self._pods[name], patch)

    def set_ready(self, name: str, status: str, reason: str = "", since: str = "") -> None:
        """The kubelet (or the node controller) sets the Ready condition: ``True``, ``False``
        or ``Unknown``; ``since`` is its lastTransitionTime (RFC 3339)."""
        cond = {"type": "Ready", "status": status, "reason": reason}
        if since:
            cond["lastTransitionTime"] = since
        self._set_status(name, [cond])

    def node(self, name: str) -> KubeNode:
        """Node ``name`` as the port shows it."""
        return parse_node(self._get(name), self._pods_on(name))

    def node_json(self, name: str) -> Obj:
        """Node ``name`` as the API's JSON (a copy)."""
        return copy.deepcopy(self._get(name))

    def changes(self) -> list[tuple[str, ...]]:
        return list(self.calls)

    # --- the store --------------------------------------------------------------------------

    def _enter(self, op: str) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise KubeUnavailableError("fake API server unreachable")
        if op in self.forbidden:
            raise KubeForbiddenError(f"{op}: forbidden (403)")

    def _get(self, name: str) -> Obj:
        if name not in self._nodes:
            raise KubeNotFoundError(f"get nodes {name}: not found (404)")
        return self._nodes[name]

    def _bump(self, obj: Obj) -> Obj:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        return obj

    def _pods_on(self, node: str) -> list[SlurmdPod]:
        pods = (parse_pod(p) for p in self._pods.values())
        return sorted((p for p in pods if p.node == node), key=lambda p: p.name)

    def _patch(self, name: str, patch: Mapping[str, Any] | None) -> bool:
        """Our merge patch of Node ``name`` as the API applies it (its resourceVersion a
        precondition); False for None (nothing to write)."""
        if patch is None:
            return False
        obj = self._get(name)
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want and want != resource_version(obj):
            raise KubeRefusedError(f"patch nodes {name}: conflict (409)")
        self._nodes[name] = self._bump(merge_patch(obj, patch))
        return True

    def _set_status(self, name: str, conditions: Sequence[Obj]) -> None:
        obj = self._get(name)
        status = dict(obj.get("status") or {})
        status["conditions"] = merge_conditions(status.get("conditions") or [], conditions)
        self._nodes[name] = self._bump({**obj, "status": status})

    def _status(self, name: str, patch: Mapping[str, Any] | None) -> bool:
        if patch is None:
            return False
        self._set_status(name, patch["status"]["conditions"])
        return True

    def _log(self, changed: bool, *call: str) -> bool:
        if changed:
            self.calls.append(call)
        return changed

    # --- the port -------------------------------------------------------------------------

    def nodes(self) -> list[KubeNode]:
        self._enter("nodes")
        return [self.node(n) for n in sorted(self._nodes)]

    def mark_unhealthy(self, node: str, fault: str, incident: str) -> bool:
        self._enter("mark_unhealthy")
        obj = self._get(node)
        changed = self._patch(node, mark_patch(obj, fault, incident, self.taint_effect))
        cond = condition_patch(self._get(node), fault, incident, self._clock())
        changed = self._status(node, cond) or changed
        return self._log(changed, "mark", node, fault, incident)

    def clear_marks(self, node: str) -> bool:
        self._enter("clear_marks")
        if node not in self._nodes:
            return False  # gone: nothing of ours is left on it
        changed = self._patch(node, clear_patch(self._get(node)))
        changed = self._status(node, condition_removal(self._get(node))) or changed
        return self._log(changed, "clear", node)

    def promote_spare(self, node: str) -> bool:
        self._enter("promote_spare")
        patch = labels_patch(self._get(node), {PROMOTED_LABEL: "true"}, [SPARE_LABEL])
        return self._log(self._patch(node, patch), "promote", node)

    def retire_spare(self, node: str) -> bool:
        self._enter("retire_spare")
        patch = labels_patch(self._get(node), {SPARE_LABEL: "true"}, [PROMOTED_LABEL])
        return self._log(self._patch(node, patch), "retire", node)

    def delete_slurmd_pods(self, node: str) -> list[str]:
        self._enter("delete_slurmd_pods")
        removed = [p.name for p in self._pods_on(node) if not p.terminating]
        for name in removed:
            del self._pods[name]
        self._log(bool(removed), "delete-pods", node)
        return removed

    def request_operator_drain(self, node: str, incident: str) -> list[str]:
        self._enter("request_operator_drain")
        changed = self._annotate_pods(node, lambda p: pod_cordon_patch(p, incident))
        self._log(bool(changed), "pod-cordon", node, incident)
        return changed

    def withdraw_operator_drain(self, node: str) -> list[str]:
        self._enter("withdraw_operator_drain")
        changed = self._annotate_pods(node, pod_uncordon_patch)
        self._log(bool(changed), "pod-uncordon", node)
        return changed

    def _annotate_pods(self, node: str, patch_for: Callable[[SlurmdPod], Obj | None]) -> list[str]:
        changed = []
        for pod in self._pods_on(node):
            patch = patch_for(pod)
            if patch is not None:
                self.patch_pod(pod.name, patch)
                changed.append(pod.name)
        return changed

    def watch(self, stop: Callable[[], bool]) -> Iterator[KubeNode]:
        """Every node once, as the real watch's first list gives them (without pods)."""
        self._enter("watch")
        for name in sorted(self._nodes):
            yield parse_node(self._nodes[name])
