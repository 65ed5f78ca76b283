"""``decide``: one health event, the policy's memory and the cluster view in, a Decision out.

Pure: no clock, no I/O. The order of the rules, each explained in the decision's ``why``:

1. heartbeats, nodes Slurm does not know and unknown fault names are ignored (with a note);
2. the verdict is the catalogue's, then XID 154's driver action (an SXid the driver called
   non-fatal is only observed), then the policy file's override, raised to the catalogue's
   ``with_companion`` when a companion was seen within the correlation window;
3. an event on a node with an active incident joins it: a repeat within the flood window, a
   follower (XID 45), a companion within the correlation window (XID 48 with 63/64), another
   line of the same job's crash, or any fault while the node is out. A joining event plans
   only what its worse verdict adds. An
   agent's summary of folded repeats (``count`` > 1) joins the node's last incident when that
   holds its fault, however late it comes: one burst of lines is one episode;
4. otherwise a follower alone, an ignore verdict and an observe verdict open nothing, except
   an observe verdict the catalogue marks ``incident`` (a slow node): a report-only incident,
   no action, never escalated, not a failure of the node;
5. otherwise a new incident opens; a failure within the escalation window of the last one
   escalates its verdict one step, and a flapping node is replaced. Escalation and flapping
   count incidents (episodes), never lines; and a fault that is usually the job's own doing
   (the catalogue's ``job_fault``: XID 13, 31, 43, 45) is neither escalated nor counted as a
   failure of the node, so a job's crash never takes its nodes out;
6. take-outs beyond the breaker's limits are held.

A take-out that replaces the node plans a promotion of the spare chosen from the view
(:func:`recovery.policy.choose_spare`), leaving out the spares ``taken`` by earlier decisions
whose promotions are still to run.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from recovery.errors import unknown_choice
from recovery.model import (
    Action,
    Decision,
    Drain,
    DriverAction,
    HealthEvent,
    PromoteSpare,
    RequeueJobs,
    SaveThenRequeue,
    Source,
    TakeDown,
    Verdict,
)
from recovery.policy.breaker import hold_reason
from recovery.policy.catalogue import Catalogue, FaultSpec
from recovery.policy.config import PolicyConfig
from recovery.policy.placement import choose_spare
from recovery.policy.state import (
    ClusterView,
    Incident,
    NodeState,
    PolicyState,
    incident_id,
    takes_out,
)

#: What XID 154's driver action means as a verdict.
DRIVER_VERDICTS: dict[DriverAction, Verdict] = {
    DriverAction.none: Verdict.ignore,
    DriverAction.drain_p2p: Verdict.drain_reset,
    DriverAction.drain_and_reset: Verdict.drain_reset,
    DriverAction.gpu_reset: Verdict.drain_reset,
    DriverAction.node_reboot: Verdict.replace_node,
}

_STEP_UP = {
    Verdict.ignore: Verdict.ignore,
    Verdict.observe: Verdict.observe,
    Verdict.restart_app: Verdict.drain_reset,
    Verdict.drain_reset: Verdict.replace_node,
    Verdict.replace_node: Verdict.replace_node,
}


@dataclass(frozen=True)
class _Ctx:
    """What every rule needs, gathered once."""

    event: HealthEvent
    view: ClusterView
    config: PolicyConfig
    state: PolicyState
    now: float
    version: str
    taken: Set[str]
    catalogue: Catalogue | None = None

    def decision(
        self,
        verdict: Verdict,
        why: str,
        *,
        incident: str | None = None,
        opens: bool = False,
        actions: tuple[Action, ...] = (),
        held: bool = False,
        escalated_from: Verdict | None = None,
        notes: tuple[str, ...] = (),
        node_failure: bool = True,
    ) -> Decision:
        extra = []
        if self.event.count > 1:
            extra.append(f"this event stands for {self.event.count} identical observations")
        if self.config.dry_run and actions:
            extra.append("dry run: the actions are recorded, not applied")
        return Decision(
            event_id=self.event.id,
            node=self.event.node,
            fault=self.event.fault,
            verdict=verdict,
            actions=actions,
            incident=incident,
            opens=opens,
            held=held,
            why=why,
            escalated_from=escalated_from,
            policy_version=self.version,
            notes=(*notes, *extra),
            node_failure=node_failure,
        )


def decide(
    state: PolicyState,
    event: HealthEvent,
    view: ClusterView,
    config: PolicyConfig,
    catalogue: Catalogue,
    now: float,
    *,
    taken: Set[str] = frozenset(),
) -> Decision:
    """Decide what ``event``, received at ``now`` (Unix seconds), means for its node.

    ``taken``: spares of ``view`` promised to earlier decisions (not chosen again).
    Never raises for a valid HealthEvent: what the policy cannot act on is ignored with a note.
    Fold the result into the state with :func:`recovery.policy.advance`.
    """
    version = f"{catalogue.version}+{config.fingerprint()}"
    ctx = _Ctx(event, view, config, state, now, version, taken, catalogue)
    if event.source is Source.heartbeat:
        return ctx.decision(Verdict.ignore, "heartbeats show liveness; they open no incident")
    if not view.has(event.node):
        note = f"node {event.node} is not in the cluster view"
        return ctx.decision(Verdict.ignore, f"{note}; nothing to act on", notes=(note,))
    spec = catalogue.lookup(event.fault)
    if spec is None:
        note = str(unknown_choice("fault", event.fault, catalogue.known()))
        return ctx.decision(Verdict.ignore, f"{note}; recorded only", notes=(note,))
    verdict, why = _verdict(spec, event, config)
    ns = state.node(event.node)
    verdict, why = _paired(spec, verdict, why, ns, config, now)
    active = _active(ns, config, now)
    if active is not None:
        joined = _join(ctx, spec, verdict, why, active)
        if joined is not None:
            return joined
    late = _late_summary(ctx, spec, why, ns)
    if late is not None:
        return late
    if spec.follows:
        return ctx.decision(
            Verdict.ignore, f"{why}; alone (no open incident on the node) it is ignored"
        )
    if verdict is Verdict.observe and spec.incident:
        return _open_report(ctx, spec, verdict, why)
    if verdict in (Verdict.ignore, Verdict.observe):
        return ctx.decision(verdict, why)
    return _open(ctx, spec, verdict, why, ns)


def _verdict(spec: FaultSpec, event: HealthEvent, config: PolicyConfig) -> tuple[Verdict, str]:
    verdict = spec.verdict
    why = f"{spec.code} ({spec.title}): {spec.says}; catalogue verdict {verdict}"
    if spec.code == "xid154" and event.driver_action is not None:
        verdict = DRIVER_VERDICTS[event.driver_action]
        why += f"; the driver asks for {event.driver_action}, so {verdict}"
    elif (
        spec.code.startswith("sxid")
        and event.driver_action is DriverAction.none
        and verdict.rank > Verdict.observe.rank
    ):
        verdict = Verdict.observe
        why += "; the driver reported this occurrence non-fatal, so it is observed"
    override = config.verdicts.get(spec.code)
    if override is not None and override is not verdict:
        verdict = override
        why += f"; the policy file sets {spec.code} to {verdict}"
    return verdict, why


def _paired(
    spec: FaultSpec, verdict: Verdict, why: str, ns: NodeState, config: PolicyConfig, now: float
) -> tuple[Verdict, str]:
    """Raise the verdict to ``with_companion`` when a companion fault was seen on the node
    within the correlation window (XID 48 with 63 or 64: drain and reset)."""
    if spec.with_companion is None or spec.with_companion.rank <= verdict.rank:
        return verdict, why
    for other in sorted(spec.companions):
        seen = ns.seen.get(other)
        if seen is not None and now - seen <= config.correlation_window_s:
            why += f"; with {other} {now - seen:g} s before: {spec.with_companion}"
            return spec.with_companion, why
    return verdict, why


def _active(ns: NodeState, config: PolicyConfig, now: float) -> Incident | None:
    """The node's incident if events may still join it: a take-out stays active until the
    node is repaired; anything else while its faults keep coming."""
    inc = ns.incident
    if inc is None:
        return None
    if inc.takes_out:
        return inc
    quiet = max(config.flood_window_s, config.correlation_window_s)
    return inc if now - inc.last_at <= quiet else None


def _join_reason(ctx: _Ctx, spec: FaultSpec, inc: Incident) -> str | None:
    last = inc.faults.get(spec.code)
    if last is not None and ctx.now - last <= ctx.config.flood_window_s:
        return f"a repeat within the flood window ({ctx.config.flood_window_s:g} s)"
    if spec.follows:
        return "it follows its companion"
    if spec.job_fault and _job_fault(ctx, inc.fault):
        return "another line of the same job's crash"
    for other in sorted(spec.companions & inc.faults.keys()):
        if ctx.now - inc.faults[other] <= ctx.config.correlation_window_s:
            return (
                f"a companion of {other} within the correlation window "
                f"({ctx.config.correlation_window_s:g} s)"
            )
    if inc.takes_out:
        return "the node is already out for it"
    return None


def _job_fault(ctx: _Ctx, fault: str) -> bool:
    spec = ctx.catalogue.lookup(fault) if ctx.catalogue is not None else None
    return spec is not None and spec.job_fault


def _join(ctx: _Ctx, spec: FaultSpec, verdict: Verdict, why: str, inc: Incident) -> Decision | None:
    reason = _join_reason(ctx, spec, inc)
    if reason is None:
        return None
    why = f"{why}; joins incident {inc.id} ({inc.fault}, {inc.verdict}): {reason}"
    upgrade = not spec.follows and verdict.rank > inc.verdict.rank
    if not upgrade:
        return ctx.decision(inc.verdict, why, incident=inc.id)
    actions = _plan(ctx, spec, verdict, escalated=False)
    if takes_out(inc.verdict):
        # The first take-out already asked for a spare (and for the jobs to leave).
        actions = tuple(a for a in actions if not isinstance(a, PromoteSpare | SaveThenRequeue))
    why += f"; {verdict} is worse than {inc.verdict}, so it adds its actions"
    held, why = _breaker(ctx, verdict, why, inc)
    return ctx.decision(verdict, why, incident=inc.id, actions=actions, held=held)


def _late_summary(ctx: _Ctx, spec: FaultSpec, why: str, ns: NodeState) -> Decision | None:
    """An agent's summary of repeats it folded (``count`` > 1) of a fault the node's last
    incident holds: part of that incident's episode, however long the agent's window took.
    Opening a new incident for it would count one burst of lines as two episodes."""
    inc = ns.incident
    if ctx.event.count <= 1 or inc is None or spec.code not in inc.faults:
        return None
    why = (
        f"{why}; joins incident {inc.id} ({inc.fault}, {inc.verdict}): the agent's summary of "
        f"{ctx.event.count} repeats of a fault the incident already holds (one episode)"
    )
    return ctx.decision(inc.verdict, why, incident=inc.id)


def _open(ctx: _Ctx, spec: FaultSpec, verdict: Verdict, why: str, ns: NodeState) -> Decision:
    if spec.job_fault:
        return _open_job_fault(ctx, spec, verdict, why)
    base = verdict
    notes: list[str] = []
    last = ns.failures[-1] if ns.failures else None
    if last is not None and ctx.now - last.at <= ctx.config.escalation_window_s:
        stepped = max(verdict, _STEP_UP[last.verdict], key=lambda v: v.rank)
        if stepped is not verdict:
            why += (
                f"; the node failed {ctx.now - last.at:g} s ago ({last.verdict}), within the "
                f"escalation window ({ctx.config.escalation_window_s:g} s): escalated to {stepped}"
            )
            verdict = stepped
    flap = ctx.config.flapping
    failures = ns.failures_since(ctx.now - flap.window_s) + 1
    if failures >= flap.threshold:
        notes.append(f"flapping: {failures} failures in {flap.window_s:g} s")
        if verdict is not Verdict.replace_node:
            verdict = Verdict.replace_node
            why += f"; the node is flapping ({failures} failures in {flap.window_s:g} s): replace"
    inc = incident_id(ctx.event.id)
    escalated = verdict is not base
    actions = _plan(ctx, spec, verdict, escalated=escalated)
    held, why = _breaker(ctx, verdict, why, None)
    return ctx.decision(
        verdict,
        why,
        incident=inc,
        opens=True,
        actions=actions,
        held=held,
        escalated_from=base if escalated else None,
        notes=tuple(notes),
    )


def _open_job_fault(ctx: _Ctx, spec: FaultSpec, verdict: Verdict, why: str) -> Decision:
    """A new incident for a fault that is usually the job's own doing: its verdict as it is
    (never escalated, whatever the node's past), not counted as a failure of the node."""
    why += (
        "; usually the job's own doing (its crash reports it on every node it ran on): not "
        "escalated and not counted as a failure of the node"
    )
    actions = _plan(ctx, spec, verdict, escalated=False)
    held, why = _breaker(ctx, verdict, why, None)
    inc = incident_id(ctx.event.id)
    return ctx.decision(
        verdict, why, incident=inc, opens=True, actions=actions, held=held, node_failure=False
    )


def _open_report(ctx: _Ctx, spec: FaultSpec, verdict: Verdict, why: str) -> Decision:
    """A new incident that only reports (the catalogue's ``incident`` with an observe verdict:
    a slow node): no action, never escalated, not counted as a failure of the node."""
    why += "; an incident to track and show, with no action (a policy verdict for it acts)"
    inc = incident_id(ctx.event.id)
    return ctx.decision(verdict, why, incident=inc, opens=True, node_failure=False)


def _breaker(ctx: _Ctx, verdict: Verdict, why: str, inc: Incident | None) -> tuple[bool, str]:
    if not takes_out(verdict) or ctx.view.is_spare(ctx.event.node):
        return False, why
    if inc is not None and inc.held:
        return True, f"{why}; held with the rest of incident {inc.id}"
    reason = hold_reason(ctx.state, ctx.event.node, ctx.view, ctx.config, ctx.now)
    if reason is None:
        return False, why
    return True, f"{why}; held: {reason}"


def _plan(ctx: _Ctx, spec: FaultSpec, verdict: Verdict, *, escalated: bool) -> tuple[Action, ...]:
    """The actions for ``verdict`` on the event's node."""
    node = ctx.event.node
    # No incident id in the reason: nodes failing together with the same fault then share one
    # reason, so the executor takes them out with one Slurm call (`recover status` maps each
    # node to its incident).
    reason = f"{spec.code} {spec.title}{', escalated' if escalated else ''}"
    # A spare runs no jobs and replaces nobody: it is only kept out of the pool.
    spare = ctx.view.is_spare(node)
    if verdict is Verdict.replace_node or (verdict is Verdict.drain_reset and not spec.can_save):
        # The GPU (or node) is gone: the jobs cannot save, so straight down.
        if spare:
            return (TakeDown(node, reason),)
        return (TakeDown(node, reason), _promote(ctx, node))
    if verdict is Verdict.drain_reset:
        if spare:
            return (Drain(node, reason),)
        save = SaveThenRequeue(node, timeout_s=ctx.config.save_timeout_s)
        return (Drain(node, reason), save, _promote(ctx, node))
    if verdict is Verdict.restart_app and not spare:
        return (RequeueJobs(node),)
    return ()


def _promote(ctx: _Ctx, node: str) -> PromoteSpare:
    """The promotion in place of ``node``, of the spare chosen among the view's ready spares
    not yet taken (none: the pool is empty)."""
    ready = [n for n in ctx.view.ready_spares if n.name not in ctx.taken]
    pick = choose_spare(ready, ctx.view.nodes[node], ctx.config)
    return PromoteSpare(node, pick.name if pick else None)
