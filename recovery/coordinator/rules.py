"""The policy with its state: what the engine asks of :mod:`recovery.policy`.

The policy is pure (state in, decision out); this holds the current :class:`PolicyState` and
advances it as the engine records decisions. Operator statements travel as events too (a
``node-repaired`` event from source ``operator``), so folding the journal's history rebuilds
exactly the state the coordinator had; breaker resets are applied at their recorded times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from recovery.model import Action, Decision, HealthEvent, PromoteSpare, Verdict
from recovery.model.events import HELD, REPAIRED, RETURNED
from recovery.policy import (
    Catalogue,
    ClusterView,
    PolicyConfig,
    PolicyState,
    RepairVerdict,
    advance,
    advance_repaired,
    breaker_reset,
    breaker_status,
    choose_spare,
    decide,
    incident_id,
    on_repaired,
)
from recovery.ports.slurm import NodeInfo


class Rules:
    """Decides with the catalogue and config, remembering what it decided."""

    def __init__(self, config: PolicyConfig, catalogue: Catalogue) -> None:
        self.config = config
        self.catalogue = catalogue
        self.state = PolicyState.empty()
        self._view: tuple[tuple[NodeInfo, ...], ClusterView] | None = None
        self._promised: set[str] = set()
        """Spares named by decided promotions that have not run yet: not chosen again."""

    def view(self, nodes: Sequence[NodeInfo]) -> ClusterView:
        """The policy's view of ``nodes``. The engine passes the same tuple for every event
        of a step; building the view (and its partition sizes) once per tuple instead of once
        per event keeps a decision at 10,000 nodes from costing milliseconds of copying."""
        if isinstance(nodes, tuple):  # immutable, so the view built from it stays right
            if self._view is None or self._view[0] is not nodes:
                self._view = (nodes, ClusterView.from_nodes(nodes))
            return self._view[1]
        return ClusterView.from_nodes(nodes)

    @property
    def hold_max_age_s(self) -> float:
        """Held actions older than this (seconds) expire instead of being replayed."""
        return self.config.breaker.hold_max_age_s

    @property
    def version(self) -> str:
        return f"{self.catalogue.version}+{self.config.fingerprint()}"

    def decide(self, event: HealthEvent, nodes: Sequence[NodeInfo], now: float) -> Decision:
        """The decision for ``event`` received at ``now`` (Unix seconds); a promotion names a
        ready spare of ``nodes`` that no promotion still to run was promised. Pure: no state
        change."""
        view = self.view(nodes)
        if event.fault == REPAIRED:
            return self._repair_decision(event, view, now)
        if event.fault == RETURNED:
            return self._returned_decision(event)
        if event.fault == HELD:  # a job's, not the node's: it opens its own incident
            return self._operator_decision(event, Verdict.observe, None, event.message)
        state, config = self.state, self.config
        return decide(state, event, view, config, self.catalogue, now, taken=self._promised)

    @property
    def promised(self) -> frozenset[str]:
        """The spares promised to promotions that have not run yet."""
        return frozenset(self._promised)

    def still_promised(self, spares: Iterable[str]) -> None:
        """What the journal says is promised (the spares its planned promotions name)
        replaces what is remembered: the engine says so on recovery and on every tick."""
        self._promised = set(spares)

    def record(self, event: HealthEvent, decision: Decision, now: float) -> None:
        """Advance the state by a decision that was recorded; the spare a promotion of it
        names (unless held) is promised from now on."""
        if not decision.held:
            self._promised.update(
                a.spare for a in decision.actions if isinstance(a, PromoteSpare) and a.spare
            )
        if event.fault == HELD:
            return  # about a job: the node's state does not change
        if event.fault == RETURNED:
            ns = self.state.node(event.node)
            if ns.out:  # its incident ends; its failures stay, for escalation and flapping
                self.state = self.state.with_node(event.node, replace(ns, incident=None, out=False))
            return
        if event.fault == REPAIRED:
            verdict = RepairVerdict(
                node=event.node,
                returned=bool(decision.actions),
                actions=decision.actions,
                why=decision.why,
                incident=decision.incident,
            )
            self.state = advance_repaired(self.state, verdict, now)
            return
        self.state = advance(self.state, event, decision, now)

    def _repair_decision(self, event: HealthEvent, view: ClusterView, now: float) -> Decision:
        verdict = on_repaired(self.state, event.node, view, self.config, now)
        return self._operator_decision(
            event, Verdict.ignore, verdict.incident, verdict.why, verdict.actions
        )

    def _returned_decision(self, event: HealthEvent) -> Decision:
        ns = self.state.node(event.node)
        inc = ns.incident
        why = (
            f"{event.message}; incident {inc.id if inc else '?'} no longer holds {event.node} "
            "out: a fault there is acted on again (its failures still count toward escalation "
            "and flapping)"
            if ns.out
            else f"{event.message}; {event.node} was not held out by recover: nothing changes"
        )
        return self._operator_decision(event, Verdict.ignore, inc.id if inc else None, why)

    def _operator_decision(
        self,
        event: HealthEvent,
        verdict: Verdict,
        incident: str | None,
        why: str,
        actions: tuple[Action, ...] = (),
    ) -> Decision:
        """A decision the coordinator makes itself, outside the catalogue (repaired, returned,
        held): it joins ``incident``, or opens the event's own when None."""
        return Decision(
            event_id=event.id,
            node=event.node,
            fault=event.fault,
            verdict=verdict,
            actions=actions,
            incident=incident or incident_id(event.id),
            opens=incident is None,
            why=why,
            policy_version=self.version,
        )

    def out_nodes(self) -> list[str]:
        """Nodes this policy took out and has not seen repaired, sorted."""
        return sorted(n for n, s in self.state.nodes.items() if s.out)

    def refuse_repair(self, node: str, nodes: Sequence[NodeInfo], now: float) -> str | None:
        """Why ``node`` cannot go back to the pool now (flapping), or None when it can.
        Raises UsageError for an unknown node or one we did not take out."""
        verdict = on_repaired(self.state, node, self.view(nodes), self.config, now)
        return None if verdict.returned else verdict.why

    def breaker_status(self, nodes: Sequence[NodeInfo], now: float) -> dict[str, Any]:
        """The breaker's window, limits and what it holds, JSON-ready."""
        view = self.view(nodes)
        return breaker_status(self.state, view, self.config, now).to_json()

    def breaker_reset(self, now: float) -> None:
        """Start the breaker's window afresh at ``now``; held take-outs young enough count now."""
        self.state = breaker_reset(self.state, now, self.config)

    def choose_spare(self, ready: Sequence[NodeInfo], failed: str | NodeInfo) -> NodeInfo | None:
        """The spare among ``ready`` (less the promised ones) to promote in place of
        ``failed``, same topology group first: the choice made again when the decision's
        spare is gone. Promised from now on."""
        pick = choose_spare([n for n in ready if n.name not in self._promised], failed, self.config)
        if pick is not None:
            self._promised.add(pick.name)
        return pick
