"""Other owners' marks: what Slinky, SUNK, Soperator, HyperPod and Kubernetes itself leave on
Slurm nodes and Kubernetes objects, so that we recognise them, never clear them, and say who
holds a node ("held by slinky").

Pure: reasons, labels, annotations and taint keys in, :class:`OtherMark` values out. The
conventions are the ones each operator documents: Slinky's slurm-operator drains with reasons
starting ``slurm-operator:`` and is asked to drain by a pod annotation; CoreWeave SUNK marks
with a node annotation and a lock taint; Nebius Soperator tags its reasons
(``[node_problem]``, ...); SageMaker HyperPod labels unhealthy Kubernetes nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SLINKY = "slinky"
SUNK = "sunk"
SOPERATOR = "soperator"
HYPERPOD = "hyperpod"
#: Someone we cannot name (a person's ``kubectl cordon``, an unknown tool).
UNKNOWN = "unknown"

#: Slinky's slurm-operator asks itself to drain the Slurm node of a pod carrying this.
SLINKY_POD_CORDON = "nodeset.slinky.slurm.net/pod-cordon"
SUNK_DRAIN_ANNOTATION = "sunk.coreweave.com/drain"
SUNK_LOCK_TAINT = "sunk.coreweave.com/lock"
HYPERPOD_HEALTH_LABEL = "node-health-status"
HYPERPOD_UNHEALTHY = frozenset({"UnschedulablePendingReboot", "UnschedulablePendingReplacement"})
#: Taints Kubernetes sets from node conditions on its own (and removes when the node is back).
KUBERNETES_TAINT_PREFIX = "node.kubernetes.io/"

_SOPERATOR_TAG = re.compile(r"\[(node|hardware|user|software)_problem\]")


@dataclass(frozen=True, order=True)
class OtherMark:
    """One mark someone else left: ``owner`` (slinky, sunk, ...) and ``what`` it is, for
    people (``taint sunk.coreweave.com/lock``)."""

    owner: str
    what: str


def reason_owner(reason: str) -> str | None:
    """The known owner of a Slurm reason, or None when it is nobody we recognise (ours, Slurm's
    own, a person's).

    Slinky writes ``slurm-operator: ...``; SUNK's reasons carry ``sunk:`` (``sunk:verify-undrain``);
    Soperator tags ``[node_problem]``, ``[hardware_problem]``, ``[user_problem]``,
    ``[software_problem]``; HyperPod writes ``Action:Reboot`` and ``Action:Replace``.
    """
    text = reason.strip()
    if text.startswith("slurm-operator:"):
        return SLINKY
    if "sunk:" in text:
        return SUNK
    if _SOPERATOR_TAG.search(text):
        return SOPERATOR
    if text.startswith("Action:Reboot") or text.startswith("Action:Replace"):
        return HYPERPOD
    return None


def node_marks(
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    taint_keys: Iterable[str],
    unschedulable: bool,
    cordoned_by_us: bool,
    our_taint_key: str,
) -> tuple[OtherMark, ...]:
    """Marks on one Kubernetes Node that are not ours, sorted.

    A cordon counts as someone else's unless our annotation says we set it. Taints under
    ``node.kubernetes.io/`` are left out: Kubernetes sets them from the node's conditions
    (not-ready, unreachable, ...) and removes them itself, and the readiness is shown anyway.
    """
    found: set[OtherMark] = set()
    for key in taint_keys:
        if key == our_taint_key or key.startswith(KUBERNETES_TAINT_PREFIX):
            continue
        if key == SUNK_LOCK_TAINT:
            found.add(OtherMark(SUNK, f"taint {key}"))
        else:
            found.add(OtherMark(UNKNOWN, f"taint {key}"))
    if SUNK_DRAIN_ANNOTATION in annotations:
        value = annotations[SUNK_DRAIN_ANNOTATION]
        found.add(OtherMark(SUNK, f"annotation {SUNK_DRAIN_ANNOTATION}={value}"))
    health = labels.get(HYPERPOD_HEALTH_LABEL, "")
    if health in HYPERPOD_UNHEALTHY:
        found.add(OtherMark(HYPERPOD, f"label {HYPERPOD_HEALTH_LABEL}={health}"))
    if unschedulable and not cordoned_by_us:
        found.add(OtherMark(UNKNOWN, "cordoned (spec.unschedulable)"))
    return tuple(sorted(found))


def pod_marks(annotations: Mapping[str, str], *, ours: bool) -> tuple[OtherMark, ...]:
    """Marks on a slurmd pod that are not ours: Slinky's pod-cordon annotation, unless
    ``ours`` (we asked for that drain ourselves and noted it)."""
    if annotations.get(SLINKY_POD_CORDON) == "true" and not ours:
        return (OtherMark(SLINKY, f"pod annotation {SLINKY_POD_CORDON}=true"),)
    return ()


def owners(marks: Iterable[OtherMark]) -> list[str]:
    """The distinct owners of ``marks``, sorted."""
    return sorted({m.owner for m in marks})
