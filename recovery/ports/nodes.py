"""``NodeControl``: what the coordinator needs from Kubernetes in a Slurm-on-Kubernetes cluster.

Each Slurm node is a slurmd pod on a Kubernetes node of the same name. When the coordinator
takes a Slurm node out, Kubernetes is told too: the node cordoned, tainted and conditioned,
its slurmd pod removed once Slurm no longer runs anything there, a Kubernetes spare promoted
beside the Slurm one. :class:`k8s.nodes.KubeControl` implements this over the Kubernetes API;
nothing in the core imports the client.

Everything we set is ours by name: the taint key, the condition type, and labels and
annotations under :data:`OUR_PREFIX`. A cordon is ours only when our annotation
:data:`CORDONED_ANNOTATION` says we set it (a node someone else cordoned stays cordoned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from recovery.ports.owners import OtherMark, owners

#: Every label and annotation we write lives under this prefix; no other is ever ours.
OUR_PREFIX = "recover.io/"
#: Our taint's key; its value is the fault (``xid79``).
TAINT_KEY = f"{OUR_PREFIX}unhealthy"
#: Our node condition's type: status False while we hold the node, reason the fault.
CONDITION_TYPE = "AcceleratorHealthy"
#: Set (``"true"``) when we cordoned the node; only then do we uncordon it.
CORDONED_ANNOTATION = f"{OUR_PREFIX}cordoned"
#: The incident that holds the node (set with our marks, removed with them).
INCIDENT_ANNOTATION = f"{OUR_PREFIX}incident"
#: A Kubernetes node in the spare pool carries ``recover.io/spare=true``.
SPARE_LABEL = f"{OUR_PREFIX}spare"
#: A spare we promoted into service carries ``recover.io/promoted=true``.
PROMOTED_LABEL = f"{OUR_PREFIX}promoted"
#: On a slurmd pod: we set Slinky's pod-cordon annotation (so only then do we remove it).
POD_CORDON_ANNOTATION = f"{OUR_PREFIX}pod-cordon"

#: Taint effects we may set (NoExecute also evicts pods that do not tolerate it).
TAINT_EFFECTS = ("NoSchedule", "NoExecute")


def condition_reason(fault: str) -> str:
    """The fault as a Kubernetes condition reason (CamelCase by convention): ``xid79`` ->
    ``Xid79``, ``node-unreachable`` -> ``NodeUnreachable``."""
    return "".join(part[:1].upper() + part[1:] for part in fault.split("-") if part)


@dataclass(frozen=True)
class OurCondition:
    """Our condition on a node as last written: ``status`` (``"False"`` while held)."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class KubeNode:
    """One Kubernetes node as the coordinator sees it.

    ``ready`` is the status of the kubelet's Ready condition (``True``, ``False``,
    ``Unknown``), empty when no kubelet ever reported; ``ready_since`` is its last transition
    (Unix seconds, 0 when unknown). ``others`` are marks someone else left on the node or its
    slurmd pods (never cleared by us).
    """

    name: str
    ready: str = ""
    ready_since: float = 0.0
    ready_reason: str = ""
    unschedulable: bool = False
    cordoned_by_us: bool = False
    our_taint: str | None = None
    """Our taint's effect when present (NoSchedule, NoExecute)."""
    condition: OurCondition | None = None
    incident: str = ""
    spare: bool = False
    promoted: bool = False
    pods: tuple[str, ...] = ()
    """The slurmd pods bound to this node (names in the configured namespace)."""
    others: tuple[OtherMark, ...] = ()

    @property
    def marked(self) -> bool:
        """Any of our unhealthy marks is on the node (cordon, taint or a False condition)."""
        held = self.condition is not None and self.condition.status == "False"
        return self.cordoned_by_us or self.our_taint is not None or held

    @property
    def unready(self) -> bool:
        """The kubelet reported the node NotReady, or the node controller lost it (Unknown)."""
        return self.ready in ("False", "Unknown")

    @property
    def held_by(self) -> list[str]:
        """Who else holds this node (owners of :attr:`others`), sorted."""
        return owners(self.others)


class NodeControl(Protocol):
    """Kubernetes as the coordinator uses it. Node names are the Slurm node names.

    Every action is idempotent and returns whether it changed anything (False, or an empty
    list: it already held). Conflicts with other writers (HTTP 409) are retried with a fresh
    read; an object that is gone (404) counts as done where that is what was asked (a pod to
    delete, marks to clear on a node that no longer exists).

    Failure modes shared by all methods: :class:`recovery.errors.KubeUnavailableError`
    (transient: the API server unreachable, timed out, overloaded),
    :class:`recovery.errors.KubeForbiddenError` (403: the ServiceAccount lacks a verb; the
    message names it), :class:`recovery.errors.KubeRefusedError` (any other refusal, e.g.
    422), and :class:`recovery.errors.KubeNotFoundError` for a node that must exist and does
    not (marking or promoting a node Kubernetes does not know).
    """

    def nodes(self) -> list[KubeNode]:
        """Every Kubernetes node with our marks, its readiness, its slurmd pods and other
        owners' marks, sorted by name."""
        ...

    def mark_unhealthy(self, node: str, fault: str, incident: str) -> bool:
        """Cordon ``node`` (noting that we did, unless someone else had cordoned it already),
        add our taint (value ``fault``, the configured effect) and the incident annotation,
        and set our condition False with reason :func:`condition_reason` of ``fault`` and
        message ``incident`` through the status subresource. Removes our spare labels."""
        ...

    def clear_marks(self, node: str) -> bool:
        """Remove our taint, our annotations and our condition; uncordon only if we cordoned.
        Other owners' marks stay. A node that no longer exists is done (False)."""
        ...

    def delete_slurmd_pods(self, node: str) -> list[str]:
        """Remove the slurmd pods bound to ``node`` (label selector and namespace from the
        configuration); by deletion, or through the Eviction API when configured. Returns the
        names removed now; pods already gone are done. The caller calls this only once the
        Slurm node is DOWN or DRAINED (Slurm first, then the pod: the order Slinky uses)."""
        ...

    def request_operator_drain(self, node: str, incident: str) -> list[str]:
        """Slinky-managed clusters: ask the slurm-operator to drain the Slurm node by setting
        its pod-cordon annotation on the node's slurmd pods (noting that we set it). Returns
        the pods annotated now."""
        ...

    def withdraw_operator_drain(self, node: str) -> list[str]:
        """Remove the pod-cordon annotation from ``node``'s slurmd pods where we set it;
        returns the pods changed."""
        ...

    def promote_spare(self, node: str) -> bool:
        """Label ``node`` as a promoted spare (``recover.io/promoted=true``, no
        ``recover.io/spare``)."""
        ...

    def retire_spare(self, node: str) -> bool:
        """Label ``node`` as a spare in the pool (``recover.io/spare=true``, no
        ``recover.io/promoted``)."""
        ...

    def watch(self, stop: Callable[[], bool]) -> Iterator[KubeNode]:
        """Every node once (the current state), then each node again whenever it changes, until
        ``stop()`` is true (checked at least every few seconds). Survives expired watches by
        listing again. Raises KubeUnavailableError when the server cannot be reached."""
        ...
