"""Kubernetes JSON in, our values out; our marks in, patches out. Pure functions over the API's
own JSON (camelCase, as the server sends it), tested on literal objects (tests/k8s/samples/).

The patches are the only place that decides what we write, so "only ours is removed" is
checked here once: every removal names one of our keys (:mod:`recovery.ports.nodes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recovery.errors import KubeRefusedError
from recovery.ports.nodes import (
    CONDITION_TYPE,
    CORDONED_ANNOTATION,
    INCIDENT_ANNOTATION,
    POD_CORDON_ANNOTATION,
    PROMOTED_LABEL,
    SPARE_LABEL,
    TAINT_KEY,
    KubeNode,
    OurCondition,
    condition_reason,
)
from recovery.ports.owners import SLINKY_POD_CORDON, node_marks, pod_marks

Obj = Mapping[str, Any]


def timestamp(text: str | None) -> float:
    """An RFC 3339 time as the API writes it (``2026-12-01T10:00:00Z``) in Unix seconds; 0
    for None or empty."""
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rfc3339(wall: float) -> str:
    """Unix seconds as the API's time format (whole seconds, UTC)."""
    return datetime.fromtimestamp(int(wall), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Obj, key: str) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get(key) or {})


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def resource_version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _taints(obj: Obj) -> list[dict[str, Any]]:
    return list((obj.get("spec") or {}).get("taints") or [])


def _conditions(obj: Obj) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or [])


def _condition(obj: Obj, kind: str) -> dict[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


@dataclass(frozen=True)
class SlurmdPod:
    """A slurmd pod: its name, the node it is bound to, whether it is being deleted, and its
    annotations."""

    name: str
    node: str
    terminating: bool
    annotations: Mapping[str, str]

    @property
    def operator_drain_ours(self) -> bool:
        """We set Slinky's pod-cordon annotation on this pod (and noted it)."""
        return POD_CORDON_ANNOTATION in self.annotations


def parse_pod(obj: Obj) -> SlurmdPod:
    """A pod object -> :class:`SlurmdPod`."""
    return SlurmdPod(
        name=name_of(obj),
        node=str((obj.get("spec") or {}).get("nodeName") or ""),
        terminating=bool((obj.get("metadata") or {}).get("deletionTimestamp")),
        annotations=_meta(obj, "annotations"),
    )


def parse_node(obj: Obj, pods: Sequence[SlurmdPod] = ()) -> KubeNode:
    """A Node object (and the slurmd pods bound to it) -> :class:`KubeNode`."""
    annotations = _meta(obj, "annotations")
    labels = _meta(obj, "labels")
    spec = obj.get("spec") or {}
    unschedulable = bool(spec.get("unschedulable"))
    ours_cordon = unschedulable and annotations.get(CORDONED_ANNOTATION) == "true"
    ready = _condition(obj, "Ready") or {}
    ours = _condition(obj, CONDITION_TYPE)
    taint = next((t for t in _taints(obj) if t.get("key") == TAINT_KEY), None)
    others = list(
        node_marks(
            labels=labels,
            annotations=annotations,
            taint_keys=[str(t.get("key", "")) for t in _taints(obj)],
            unschedulable=unschedulable,
            cordoned_by_us=ours_cordon,
            our_taint_key=TAINT_KEY,
        )
    )
    for pod in pods:
        others.extend(pod_marks(pod.annotations, ours=pod.operator_drain_ours))
    return KubeNode(
        name=name_of(obj),
        ready=str(ready.get("status", "")),
        ready_since=timestamp(ready.get("lastTransitionTime")),
        ready_reason=str(ready.get("reason", "")),
        unschedulable=unschedulable,
        cordoned_by_us=ours_cordon,
        our_taint=str(taint.get("effect", "")) if taint else None,
        condition=_our_condition(ours),
        incident=annotations.get(INCIDENT_ANNOTATION, ""),
        spare=labels.get(SPARE_LABEL) == "true",
        promoted=labels.get(PROMOTED_LABEL) == "true",
        pods=tuple(sorted(p.name for p in pods)),
        others=tuple(sorted(set(others))),
    )


def _our_condition(cond: Mapping[str, Any] | None) -> OurCondition | None:
    if cond is None:
        return None
    return OurCondition(
        str(cond.get("status", "")), str(cond.get("reason", "")), str(cond.get("message", ""))
    )


def parse_watch_line(line: str) -> tuple[str, dict[str, Any]]:
    """One line of a watch stream -> (type, object): ``ADDED``, ``MODIFIED``, ``DELETED``,
    ``BOOKMARK`` or ``ERROR`` (the object is then a Status with ``code``). Raises
    KubeRefusedError for a line that is not a watch event."""
    try:
        event = json.loads(line)
        return str(event["type"]), dict(event["object"])
    except (ValueError, KeyError, TypeError) as e:
        raise KubeRefusedError(f"not a watch event: {line[:200]!r}") from e


# --- patches: what we write ---------------------------------------------------------------


def mark_patch(obj: Obj, fault: str, incident: str, effect: str) -> dict[str, Any] | None:
    """A JSON merge patch that cordons, taints and annotates the node, or None when every mark
    already holds. Carries the resourceVersion it was computed from, so a node changed in
    between is refused (409) instead of overwritten (the taint list is replaced whole).

    A node someone else cordoned stays theirs: we do not note the cordon as ours. Our spare
    labels are removed (a failed node is no spare).
    """
    annotations = _meta(obj, "annotations")
    labels = _meta(obj, "labels")
    spec = obj.get("spec") or {}
    meta: dict[str, Any] = {}
    spec_patch: dict[str, Any] = {}
    if not spec.get("unschedulable"):
        spec_patch["unschedulable"] = True
        meta.setdefault("annotations", {})[CORDONED_ANNOTATION] = "true"
    if annotations.get(INCIDENT_ANNOTATION) != incident:
        meta.setdefault("annotations", {})[INCIDENT_ANNOTATION] = incident
    ours = {"key": TAINT_KEY, "value": fault, "effect": effect}
    taints = _taints(obj)
    mine = [t for t in taints if t.get("key") == TAINT_KEY]
    if [{k: t.get(k) for k in ("key", "value", "effect")} for t in mine] != [ours]:
        spec_patch["taints"] = [t for t in taints if t.get("key") != TAINT_KEY] + [ours]
    gone = [k for k in (SPARE_LABEL, PROMOTED_LABEL) if k in labels]
    if gone:
        meta["labels"] = dict.fromkeys(gone)
    return _with_version(obj, meta, spec_patch)


def clear_patch(obj: Obj) -> dict[str, Any] | None:
    """A JSON merge patch that removes our taint and annotations and uncordons the node if
    (and only if) we cordoned it; None when none of that is there."""
    annotations = _meta(obj, "annotations")
    spec_patch: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    taints = _taints(obj)
    kept = [t for t in taints if t.get("key") != TAINT_KEY]
    if len(kept) != len(taints):
        spec_patch["taints"] = kept or None
    if annotations.get(CORDONED_ANNOTATION) == "true" and (obj.get("spec") or {}).get(
        "unschedulable"
    ):
        spec_patch["unschedulable"] = None
    gone = [k for k in (CORDONED_ANNOTATION, INCIDENT_ANNOTATION) if k in annotations]
    if gone:
        meta["annotations"] = dict.fromkeys(gone)
    return _with_version(obj, meta, spec_patch)


def labels_patch(obj: Obj, put: Mapping[str, str], drop: Iterable[str]) -> dict[str, Any] | None:
    """A merge patch setting our labels ``put`` and removing our labels ``drop``; None when
    they already hold."""
    labels = _meta(obj, "labels")
    change: dict[str, str | None] = {k: v for k, v in put.items() if labels.get(k) != v}
    change.update({k: None for k in drop if k in labels})
    return _with_version(obj, {"labels": change} if change else {}, {})


def _with_version(obj: Obj, meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
    if not meta and not spec:
        return None
    patch: dict[str, Any] = {"metadata": {**meta, "resourceVersion": resource_version(obj)}}
    if spec:
        patch["spec"] = spec
    return patch


def condition_patch(obj: Obj, fault: str, incident: str, now_wall: float) -> dict[str, Any] | None:
    """A strategic merge patch for the status subresource setting our condition False (reason
    from the fault, message the incident), or None when it already says so. Conditions merge
    by type, so other conditions (the kubelet's) are untouched."""
    want = {"status": "False", "reason": condition_reason(fault), "message": incident}
    have = _condition(obj, CONDITION_TYPE) or {}
    if all(have.get(k) == v for k, v in want.items()):
        return None
    stamp = rfc3339(now_wall)
    changed = have.get("status") != "False"
    cond = {
        "type": CONDITION_TYPE,
        **want,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp if changed else have.get("lastTransitionTime", stamp),
    }
    return {"status": {"conditions": [cond]}}


def condition_removal(obj: Obj) -> dict[str, Any] | None:
    """A strategic merge patch deleting our condition (and only it), or None when absent."""
    if _condition(obj, CONDITION_TYPE) is None:
        return None
    return {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}


def pod_cordon_patch(pod: SlurmdPod, incident: str) -> dict[str, Any] | None:
    """A merge patch asking Slinky to drain the pod's Slurm node, noting that we asked; None
    when the annotation is there already (ours, or someone else's: then it stays theirs)."""
    if pod.annotations.get(SLINKY_POD_CORDON) == "true":
        return None
    marks = {SLINKY_POD_CORDON: "true", POD_CORDON_ANNOTATION: incident}
    return {"metadata": {"annotations": marks}}


def pod_uncordon_patch(pod: SlurmdPod) -> dict[str, Any] | None:
    """A merge patch withdrawing the pod-cordon we set; None when we did not set it."""
    if not pod.operator_drain_ours:
        return None
    return {"metadata": {"annotations": {SLINKY_POD_CORDON: None, POD_CORDON_ANNOTATION: None}}}
