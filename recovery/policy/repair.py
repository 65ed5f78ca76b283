"""Repairs: an operator says a node we took out is healthy again. Never held by the breaker
(a tripped breaker must not block the way back)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from recovery.errors import UsageError, unknown_choice
from recovery.model import Action, ReturnToPool
from recovery.policy.config import PolicyConfig
from recovery.policy.state import ClusterView, PolicyState


@dataclass(frozen=True)
class RepairVerdict:
    """The answer to "``node`` is repaired": ``returned`` with ``actions`` (ReturnToPool), or
    a refusal (``flapping``) that ``why`` explains. ``incident`` is the incident it ends."""

    node: str
    returned: bool
    actions: tuple[Action, ...]
    why: str
    incident: str | None
    flapping: bool = False


def on_repaired(
    state: PolicyState, node: str, view: ClusterView, config: PolicyConfig, now: float
) -> RepairVerdict:
    """Decide whether repaired ``node`` goes back into the spare pool at ``now`` (Unix s).

    A flapping node (``config.flapping``) stays out. Raises
    :class:`recovery.errors.UsageError` for a node Slurm does not know (listing the known
    ones), a node we did not take out, or one whose Slurm reason is now someone else's.
    """
    if not view.has(node):
        raise unknown_choice("node", node, view.names)
    ns = state.node(node)
    inc = ns.incident
    if not ns.out:
        raise UsageError(
            f"node {node} was not taken out by recover (no incident of ours holds it out); "
            "there is nothing to return"
        )
    info = view.nodes[node]
    if info.held_by_other:
        who = info.reason_set_by or "unknown user"
        raise UsageError(
            f"node {node} is out with reason {info.reason!r} set by {who}, which is not ours; "
            "recover only returns nodes it took out itself"
        )
    inc_id = inc.id if inc else None
    flap = config.flapping
    failures = ns.failures_since(now - flap.window_s)
    if failures >= flap.threshold:
        return RepairVerdict(
            node=node,
            returned=False,
            actions=(),
            why=(
                f"node {node} is flapping ({failures} failures in {flap.window_s:g} s, "
                f"threshold {flap.threshold}): it stays out and is not returned to the spare pool"
            ),
            incident=inc_id,
            flapping=True,
        )
    return RepairVerdict(
        node=node,
        returned=True,
        actions=(ReturnToPool(node),),
        why=f"node {node} is repaired and goes back into the spare pool",
        incident=inc_id,
    )


def advance_repaired(state: PolicyState, verdict: RepairVerdict, now: float) -> PolicyState:
    """The state after ``verdict`` at ``now``: a returned node is no longer out and its
    incident ends (its failures stay, for escalation and flapping); a refusal changes nothing."""
    if not verdict.returned:
        return state
    ns = state.node(verdict.node)
    return state.with_node(verdict.node, replace(ns, incident=None, out=False))
