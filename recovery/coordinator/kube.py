"""Kubernetes kept in step with Slurm, one reconcile tick at a time (only when a
:class:`recovery.ports.nodes.NodeControl` is configured; Slurm-only clusters never get here).

Per open incident, in order, each step journaled as a phase once it held:

1. ``k8s-marked``: after Slurm took the node out (``node-down``/``node-drained``), the
   Kubernetes node is cordoned, tainted and conditioned.
2. ``slurmd-pod-deleted``: only once Slurm holds the node DOWN or DRAINED (not DRAINING: a job
   still runs there), its slurmd pod is removed - Slurm first, then the pod, the order Slinky
   uses. A node that came back into service first is left alone (``slurmd-pod-kept``).
3. ``k8s-spare-promoted``: after Slurm's ``spare-promoted``, the same node in Kubernetes.

A node Kubernetes does not know ends the incident's Kubernetes steps (``k8s-skipped``); a
verdict (403, 422) ends them too (``k8s-failed``, with the server's words); transient errors
are retried on the next tick. The steps are idempotent through the port and decided from the
journal's phases alone (:func:`due`), so a restarted coordinator picks up where it stopped.

In a Slinky-managed cluster (``via_operator``) take-outs are requested from the slurm-operator
through its pod annotation instead of Slurm commands (:meth:`KubeFollow.operator_take_out`),
and the operator, which owns its pods, removes them itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from recovery.errors import (
    KubeNotFoundError,
    RecoverError,
    TransientError,
)
from recovery.model import HealthEvent, Source, TakeDown
from recovery.model.events import UNREACHABLE
from recovery.ports.clock import Clock
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    IncidentRecord,
    Journal,
    Phase,
    PhaseName,
)
from recovery.ports.nodes import KubeNode, NodeControl
from recovery.ports.slurm import NodeInfo, SlurmControl

#: Phases that end an incident's Kubernetes steps.
ENDED = frozenset({PhaseName.k8s_skipped, PhaseName.k8s_failed})
#: Phases after which Slurm holds the node out (written by the executor).
TAKEN_OUT = frozenset({PhaseName.node_down, PhaseName.node_drained})
#: Phases that settle the slurmd pod: removed, or kept (the node came back first).
POD_SETTLED = frozenset({PhaseName.slurmd_pod_deleted, PhaseName.slurmd_pod_kept})


@dataclass(frozen=True)
class KubeMode:
    """How the coordinator works with Kubernetes."""

    via_operator: bool = False
    """Slinky: ask the slurm-operator to drain (pod annotation) instead of calling Slurm, and
    leave the slurmd pods to it."""
    view_every_s: float = 5.0
    """Seconds between reads of every Kubernetes node for ``recover status``."""

    @property
    def delete_pods(self) -> bool:
        return not self.via_operator


def released(node: NodeInfo | None) -> bool:
    """Slurm holds ``node`` DOWN, or DRAINED: drain flag and nothing left running on it (state
    IDLE, no COMPLETING). A DRAINING node (ALLOCATED/MIXED+DRAIN) is not released."""
    if node is None:
        return False
    if node.down:
        return True
    return node.drained and node.state == "IDLE" and "COMPLETING" not in node.flags


def due(
    inc: IncidentRecord, slurm: NodeInfo | None, mode: KubeMode, seen_at: float | None = None
) -> PhaseName | None:
    """The next Kubernetes step ``inc`` needs now (a phase name), or None. Pure.

    ``slurm`` is the node as Slurm showed it at ``seen_at`` (monotonic seconds); a look taken
    before the take-out was recorded says nothing about the pod yet (None: no such check).
    """
    have = {p.name for p in inc.phases}
    if have & ENDED:
        return None
    if have & TAKEN_OUT and PhaseName.k8s_marked not in have:
        return PhaseName.k8s_marked
    taken = [p.at.mono for p in inc.phases if p.name in TAKEN_OUT]
    if seen_at is not None and (not taken or seen_at <= min(taken)):
        slurm = None  # seen before Slurm took the node out: wait for the next look
    if PhaseName.k8s_marked in have and mode.delete_pods and not have & POD_SETTLED:
        if released(slurm):
            return PhaseName.slurmd_pod_deleted
        if slurm is not None and slurm.in_service:
            return PhaseName.slurmd_pod_kept
    if _spare_due(inc, have):
        return PhaseName.k8s_spare_promoted
    return None


def _spare_due(inc: IncidentRecord, have: set[PhaseName]) -> bool:
    """Slurm promoted the incident's spare; Kubernetes did not yet."""
    promoted = PhaseName.spare_promoted in have and inc.info.get("spare")
    return bool(promoted) and PhaseName.k8s_spare_promoted not in have


def finished(inc: IncidentRecord, mode: KubeMode) -> bool:
    """No Kubernetes step of ``inc`` is outstanding: the incident may close. Pure."""
    have = {p.name for p in inc.phases}
    if have & ENDED:
        return True
    if have & TAKEN_OUT and PhaseName.k8s_marked not in have:
        return False
    if PhaseName.k8s_marked in have and mode.delete_pods and not have & POD_SETTLED:
        return False
    return not _spare_due(inc, have)


def unready_event(node: KubeNode, now_wall: float) -> HealthEvent | None:
    """A ``node-unreachable`` event for a node Kubernetes reports NotReady (``False``) or lost
    (``Unknown``), else None. The id comes from the node, the status and the time of the
    transition, so the same outage seen again (a new watch, a restart) is a duplicate. A name
    that is no Slurm node name gives None."""
    if not node.unready:
        return None
    since = int(node.ready_since) or int(now_wall)
    why = f": {node.ready_reason}" if node.ready_reason else ""
    try:
        return HealthEvent(
            id=f"k8s-{node.name}-ready-{node.ready.lower()}-{since}",
            node=node.name,
            source=Source.k8s,
            fault=UNREACHABLE,
            observed_at=float(since),
            message=f"Kubernetes reports {node.name} Ready={node.ready}{why}",
        )
    except ValidationError:
        return None


class KubeFollow:
    """Runs the steps above for the engine (its worker thread only)."""

    def __init__(
        self,
        *,
        journal: Journal,
        nodes: NodeControl,
        clock: Clock,
        mode: KubeMode = KubeMode(),  # frozen, one shared default is safe
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.journal = journal
        self.nodes = nodes
        self.clock = clock
        self.mode = mode
        self.log = log
        self._view: dict[str, KubeNode] = {}
        self._view_at: float | None = None

    def _phase(self, incident: str, name: PhaseName, detail: str = "") -> None:
        self.journal.add_phase(incident, Phase(name, self.clock.now(), detail))

    # --- per tick -------------------------------------------------------------------------

    def reconcile(
        self,
        incidents: Sequence[IncidentRecord],
        view: Mapping[str, NodeInfo],
        seen_at: float | None = None,
    ) -> None:
        """Run every step that is due, incident by incident, against Slurm's ``view`` taken
        at ``seen_at`` (monotonic s); a transient error stops this incident's steps until the
        next tick."""
        for inc in incidents:
            for _ in range(4):  # at most every step once per tick
                step = due(inc, view.get(inc.node), self.mode, seen_at)
                if step is None or not self._run(inc, step):
                    break
                inc = self.journal.incident(inc.id)

    def _run(self, inc: IncidentRecord, step: PhaseName) -> bool:
        try:
            detail = self._apply(inc, step)
        except KubeNotFoundError as e:
            self._phase(inc.id, PhaseName.k8s_skipped, f"no such Kubernetes node: {e}")
            return False
        except TransientError as e:
            self.log(f"kubernetes {step} {inc.node}: {e}; will retry")
            return False
        except RecoverError as e:
            self._phase(inc.id, PhaseName.k8s_failed, f"{step}: {e}")
            self.log(f"kubernetes {step} {inc.node} failed: {e}")
            return False
        self._phase(inc.id, step, detail)
        return True

    def _apply(self, inc: IncidentRecord, step: PhaseName) -> str:
        node = inc.node
        if step == PhaseName.k8s_marked:
            changed = self.nodes.mark_unhealthy(node, inc.fault, inc.id)
            return node if changed else f"{node} already marked"
        if step == PhaseName.slurmd_pod_deleted:
            pods = self.nodes.delete_slurmd_pods(node)
            return " ".join(pods) or "no slurmd pod left"
        if step == PhaseName.slurmd_pod_kept:
            return f"{node} back in service in Slurm before its pod was removed"
        spare = str(inc.info.get("spare"))
        changed = self.nodes.promote_spare(spare)
        return spare if changed else f"{spare} already promoted"

    # --- the way back -------------------------------------------------------------------

    def return_to_pool(self, rec: ActionRecord) -> None:
        """A repaired node went back to the Slurm pool: clear our marks (only ours), withdraw
        a pod-cordon we asked for, label it a spare. Raises like the port; the executor
        retries the action until this holds. A node Kubernetes does not know is skipped."""
        node = rec.action.node
        try:
            cleared = self.nodes.clear_marks(node)
            if self.mode.via_operator:
                self.nodes.withdraw_operator_drain(node)
            note = node if cleared else f"{node} had none of ours"
            self._phase(rec.incident, PhaseName.k8s_cleared, note)
            self.nodes.retire_spare(node)
        except KubeNotFoundError as e:
            self._phase(rec.incident, PhaseName.k8s_skipped, f"no such Kubernetes node: {e}")
            return
        self._phase(rec.incident, PhaseName.k8s_spare_retired, node)

    # --- Slinky: take-outs through the operator --------------------------------------------

    def operator_take_out(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        """Ask the slurm-operator to drain the node (its pod annotation); the action waits
        until Slurm shows the drain (:meth:`finish_operator_take_out`)."""
        pods = self.nodes.request_operator_drain(rec.action.node, rec.incident)
        requested = " ".join(pods) or "already requested"
        self._phase(rec.incident, PhaseName.operator_drain_requested, requested)
        return ActionStatus.waiting, "drain requested from the slurm-operator; waiting for it"

    def finish_operator_take_out(
        self, rec: ActionRecord, node: NodeInfo | None, slurm: SlurmControl
    ) -> bool:
        """Done once Slurm shows the node drained or down (by the operator). A take-down's
        jobs cannot save on a node that lost its GPU, so they are requeued then. Returns True
        when the action completed."""
        if node is None or not node.out_of_service:
            return False
        requeued = []
        try:
            if isinstance(rec.action, TakeDown):
                jobs = slurm.jobs_on(node.name)
                requeued = [j.job_id for j in jobs if slurm.requeue(j.job_id)]
        except TransientError as e:
            self.log(f"requeue on {node.name}: {e}; will retry")
            return False
        except RecoverError as e:
            self.journal.record_outcome(
                rec.id, ActionStatus.failed, self.clock.now(), detail=str(e),
                attempts=rec.attempts + 1,
            )  # fmt: skip
            return True
        phase = PhaseName.node_down if node.down else PhaseName.node_drained
        self._phase(rec.incident, phase, f"{node.name} by the slurm-operator: {node.reason}")
        detail = "drained by the slurm-operator"
        if requeued:
            detail += f"; requeued {' '.join(requeued)}"
        self.journal.record_outcome(
            rec.id, ActionStatus.done, self.clock.now(), detail=detail, attempts=rec.attempts + 1
        )
        return True

    # --- status ---------------------------------------------------------------------------

    def view(self, now_mono: float) -> dict[str, KubeNode]:
        """Every Kubernetes node by name, read again every ``view_every_s`` seconds; the last
        view is kept while the API server cannot be reached."""
        if self._view_at is None or now_mono - self._view_at >= self.mode.view_every_s:
            try:
                self._view = {n.name: n for n in self.nodes.nodes()}
                self._view_at = now_mono
            except RecoverError as e:
                self.log(f"kubernetes: cannot read nodes: {e}")
                self._view_at = now_mono  # try again after view_every_s, not every tick
        return self._view
