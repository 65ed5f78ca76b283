"""JSON-ready views of the coordinator's state for ``GET /v1/nodes``, ``/v1/status`` and
``/v1/breaker``. Pure: snapshots in, dicts out."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from recovery.pool.spares import SPARE_REASON, is_ready_spare, is_spare
from recovery.ports.clock import Stamp
from recovery.ports.journal import ActionRecord, IncidentRecord
from recovery.ports.nodes import KubeNode
from recovery.ports.owners import reason_owner
from recovery.ports.slurm import NodeInfo, is_ours, is_slurms_own

#: Journal meta key: the cluster's layout (nodes, partitions, features, spares) as last seen.
LAYOUT_KEY = "cluster_layout"


def layout_json(view: Sequence[NodeInfo]) -> str:
    """The parts of the cluster the policy depends on, as stable JSON: which nodes exist, their
    partitions and features, and which are spares. Node states are left out on purpose."""
    return json.dumps(
        [
            {
                "name": n.name,
                "partitions": list(n.partitions),
                "features": sorted(n.features),
                "spare": is_spare(n),
            }
            for n in view
        ],
        sort_keys=True,
    )


def layout_nodes(text: str) -> list[NodeInfo]:
    """Nodes, all idle and in service (spares drained as spares), from :func:`layout_json`."""
    return [
        NodeInfo(
            name=d["name"],
            state="IDLE",
            flags=frozenset({"DRAIN"}) if d["spare"] else frozenset(),
            reason=SPARE_REASON if d["spare"] else "",
            partitions=tuple(d["partitions"]),
            features=frozenset(d["features"]),
        )
        for d in json.loads(text)
    ]


def holder(node: NodeInfo) -> str:
    """Who holds the node out of service: ``""`` (in service), ``recover``, ``slurm``
    (slurmctld itself, e.g. not responding), an operator we recognise by its reason
    (``slinky``, ``sunk``, ``soperator``, ``hyperpod``) or the user who set the reason."""
    if not (node.down or node.drained):
        return ""
    if is_ours(node.reason):
        return "recover"
    if is_slurms_own(node.reason):
        return "slurm"
    return reason_owner(node.reason) or node.reason_set_by or "unknown"


def kube_row(node: KubeNode | None) -> dict[str, Any] | None:
    """The Kubernetes side of a node row: readiness, our marks, and other owners' marks
    (``held_by``: who else holds it, e.g. ``["sunk"]``); None when Kubernetes is not used
    or has no such node."""
    if node is None:
        return None
    return {
        "ready": node.ready,
        "cordoned": node.unschedulable,
        "marked": node.marked,
        "spare": node.spare,
        "promoted": node.promoted,
        "pods": list(node.pods),
        "held_by": node.held_by,
        "others": [m.what for m in node.others],
    }


def node_rows(
    view: Sequence[NodeInfo],
    open_incidents: Sequence[IncidentRecord],
    at: Stamp | None,
    suspects: frozenset[str] = frozenset(),
    kube: Mapping[str, KubeNode] | None = None,
) -> list[dict[str, Any]]:
    """One row per node: state, flags, reason, holder, spare, open incident, whether its
    agent went silent (``suspect``), and its Kubernetes node (``k8s``, see :func:`kube_row`)."""
    incident_of = {i.node: i.id for i in open_incidents}
    kube = kube or {}
    return [
        {
            "name": n.name,
            "state": n.state,
            "flags": sorted(n.flags),
            "reason": n.reason,
            "held_by": holder(n),
            "spare": is_spare(n),
            "ready_spare": is_ready_spare(n),
            "in_service": n.in_service,
            "incident": incident_of.get(n.name),
            "suspect": n.name in suspects,
            "seen_at": at.wall if at else None,
            "k8s": kube_row(kube.get(n.name)),
        }
        for n in view
    ]


def incident_summary(inc: IncidentRecord) -> dict[str, Any]:
    """The short form of an incident: id, node, fault, verdict, status, last phase."""
    last = max(inc.phases, key=lambda p: p.at.wall).name if inc.phases else ""
    return {
        "id": inc.id,
        "node": inc.node,
        "fault": inc.fault,
        "verdict": inc.verdict,
        "status": inc.status.value,
        "opened": inc.opened.wall,
        "last_phase": last,
        "jobs": list(inc.jobs),
    }


def breaker_view(status: dict[str, Any], held: Sequence[ActionRecord]) -> dict[str, Any]:
    """The policy's breaker status plus the actions it holds."""
    return {
        **status,
        "held_incidents": status.get("held", []),
        "held": [
            {
                "id": r.id,
                "incident": r.incident,
                "action": r.action.to_json(),
                "held_since": r.planned.wall if r.planned else None,
            }
            for r in held
        ],
    }


def status_view(
    view: Sequence[NodeInfo],
    open_incidents: Sequence[IncidentRecord],
    breaker: dict[str, Any],
    at: Stamp | None,
    suspects: frozenset[str] = frozenset(),
    *,
    dry_run: bool,
    kube: Mapping[str, KubeNode] | None = None,
) -> dict[str, Any]:
    """Everything ``recover status`` shows."""
    return {
        "nodes": node_rows(view, open_incidents, at, suspects, kube),
        "incidents": [incident_summary(i) for i in open_incidents],
        "spares": [n.name for n in view if is_ready_spare(n)],
        "breaker": breaker,
        "dry_run": dry_run,
        "seen_at": at.wall if at else None,
    }
