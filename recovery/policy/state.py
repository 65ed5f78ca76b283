"""What the policy knows: a view of the cluster (from Slurm) and its own memory of faults.

:class:`PolicyState` is immutable and changes only through :func:`advance` (one decided event)
and the repair and breaker functions, so the coordinator can rebuild it at start-up by folding
the journal's ``(event, decision)`` history in order. All times are Unix seconds on the
timeline of event receipt (the ``now`` passed to :func:`recovery.policy.decide`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

from recovery.model import Decision, HealthEvent, PromoteSpare, Source, Verdict
from recovery.pool.spares import is_ready_spare, is_spare
from recovery.ports.slurm import NodeInfo

#: Pseudo-partition of nodes that Slurm lists in no partition.
NO_PARTITION = "(none)"
#: Failures remembered per node: enough for any escalation or flapping window in practice,
#: and it keeps the state's size bounded however long the coordinator runs.
MAX_FAILURES = 64

_K = TypeVar("_K")
_V = TypeVar("_V")


def frozen_map(data: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """A read-only copy of ``data``."""
    return MappingProxyType(dict(data))


def incident_id(event_id: str) -> str:
    """The id of the incident an event opens: deterministic, so replays give the same ids."""
    return "inc-" + hashlib.sha256(event_id.encode()).hexdigest()[:10]


def takes_out(verdict: Verdict) -> bool:
    """True for the verdicts that take a node out of service (drain-reset, replace)."""
    return verdict.rank >= Verdict.drain_reset.rank


@dataclass(frozen=True)
class ClusterView:
    """The cluster as Slurm last described it. Build with :meth:`from_nodes`."""

    nodes: Mapping[str, NodeInfo] = field(default_factory=lambda: frozen_map({}))

    @classmethod
    def from_nodes(cls, nodes: Sequence[NodeInfo]) -> ClusterView:
        """The view of ``nodes`` (a later duplicate name wins)."""
        # The dict is new and never escapes: wrapped, not copied a second time.
        return cls(MappingProxyType({n.name: n for n in nodes}))

    def has(self, node: str) -> bool:
        """True when Slurm knows ``node``."""
        return node in self.nodes

    @property
    def names(self) -> list[str]:
        """Every node's name, sorted."""
        return sorted(self.nodes)

    def is_spare(self, node: str) -> bool:
        """True when ``node`` sits in the spare pool: drained with :data:`SPARE_REASON`."""
        info = self.nodes.get(node)
        return info is not None and is_spare(info)

    @cached_property
    def spares(self) -> frozenset[str]:
        """Nodes in the spare pool."""
        return frozenset(n for n in self.nodes if self.is_spare(n))

    @cached_property
    def ready_spares(self) -> tuple[NodeInfo, ...]:
        """Spares that could be promoted now (:func:`recovery.pool.spares.is_ready_spare`)."""
        return tuple(n for n in self.nodes.values() if is_ready_spare(n))

    @cached_property
    def in_service(self) -> frozenset[str]:
        """Nodes that may receive new jobs."""
        return frozenset(n for n, info in self.nodes.items() if info.in_service)

    def partitions_of(self, node: str) -> tuple[str, ...]:
        """The partitions ``node`` belongs to; ``(NO_PARTITION,)`` when Slurm lists none."""
        info = self.nodes.get(node)
        return (info.partitions or (NO_PARTITION,)) if info else ()

    @cached_property
    def partition_sizes(self) -> Mapping[str, int]:
        """Nodes per partition, spares not counted (they serve no jobs). Computed once per
        view: the breaker asks for it on every take-out decision, and at 10,000 nodes the
        count took longer than the rest of the decision."""
        sizes: dict[str, int] = {}
        for name in self.nodes:
            if not self.is_spare(name):
                for part in self.partitions_of(name):
                    sizes[part] = sizes.get(part, 0) + 1
        return frozen_map(sizes)


@dataclass(frozen=True)
class Incident:
    """One fault on one node and every event that joined it.

    ``faults`` maps each fault seen in the incident to the last time it was seen; ``events``
    counts observations (an event's ``count`` included); ``held`` means the breaker holds its
    take-out actions.
    """

    id: str
    fault: str
    verdict: Verdict
    opened_at: float
    last_at: float
    faults: Mapping[str, float]
    events: int = 1
    held: bool = False

    @property
    def takes_out(self) -> bool:
        """The incident takes (or took) the node out of service."""
        return takes_out(self.verdict)


@dataclass(frozen=True)
class Failure:
    """An incident the node opened: when (Unix seconds) and with which verdict."""

    at: float
    verdict: Verdict


@dataclass(frozen=True)
class NodeState:
    """What the policy remembers of one node.

    ``seen`` maps each fault to the last time it was seen on the node (whatever its verdict);
    ``failures`` are the last :data:`MAX_FAILURES` incidents opened, oldest first; ``out`` means
    we took the node out and it has not been returned yet.
    """

    seen: Mapping[str, float] = field(default_factory=lambda: frozen_map({}))
    incident: Incident | None = None
    failures: tuple[Failure, ...] = ()
    out: bool = False

    def failures_since(self, since: float) -> int:
        """Failures at or after ``since`` (Unix seconds)."""
        return sum(1 for f in self.failures if f.at >= since)


@dataclass(frozen=True)
class PolicyState:
    """The policy's whole memory. ``taken_out`` maps each node to its last take-out time (what
    the breaker counts); ``reset_at`` is the last breaker reset (None: never)."""

    nodes: Mapping[str, NodeState] = field(default_factory=lambda: frozen_map({}))
    taken_out: Mapping[str, float] = field(default_factory=lambda: frozen_map({}))
    reset_at: float | None = None

    @classmethod
    def empty(cls) -> PolicyState:
        """The state before any event."""
        return cls()

    def node(self, name: str) -> NodeState:
        """What is known of ``name`` (an empty record for a node never seen)."""
        return self.nodes.get(name) or NodeState()

    def with_node(self, name: str, node: NodeState) -> PolicyState:
        """A copy with ``name``'s record replaced."""
        return replace(self, nodes=frozen_map({**self.nodes, name: node}))

    def held_incidents(self) -> list[tuple[str, Incident]]:
        """``(node, incident)`` for every incident whose take-out the breaker holds, oldest
        first."""
        held = [(n, s.incident) for n, s in self.nodes.items() if s.incident and s.incident.held]
        return sorted(held, key=lambda p: (p[1].opened_at, p[0]))

    def first_held(self) -> tuple[int, str | None]:
        """``(how many incidents are held, the oldest one's id)``: what the breaker checks on
        every take-out, in one pass without sorting (a storm holds hundreds)."""
        count, first, key = 0, None, (0.0, "")
        for n, s in self.nodes.items():
            inc = s.incident
            if inc is not None and inc.held:
                count += 1
                if first is None or (inc.opened_at, n) < key:
                    first, key = inc.id, (inc.opened_at, n)
        return count, first


def advance(state: PolicyState, event: HealthEvent, decision: Decision, now: float) -> PolicyState:
    """The state after ``event`` was decided as ``decision`` at ``now`` (Unix seconds).

    Pure: folding a journal's history through :func:`recovery.policy.decide` and this gives the
    same state every time. Heartbeats leave the state as it is.
    """
    if event.source is Source.heartbeat:
        return state
    ns = state.node(event.node)
    ns = replace(ns, seen=frozen_map({**ns.seen, event.fault: now}))
    if decision.incident is None:
        return state.with_node(event.node, ns)
    inc = ns.incident
    if decision.opens or inc is None or inc.id != decision.incident:
        inc = Incident(
            id=decision.incident,
            fault=event.fault,
            verdict=decision.verdict,
            opened_at=now,
            last_at=now,
            faults=frozen_map({event.fault: now}),
            events=event.count,
            held=decision.held,
        )
        if decision.node_failure:  # a job's own crash is no failure of its nodes
            failures = (*ns.failures, Failure(now, decision.verdict))[-MAX_FAILURES:]
            ns = replace(ns, failures=failures)
    else:
        inc = replace(
            inc,
            verdict=max(inc.verdict, decision.verdict, key=lambda v: v.rank),
            last_at=now,
            faults=frozen_map({**inc.faults, event.fault: now}),
            events=inc.events + event.count,
            held=inc.held or decision.held,
        )
    ns = replace(ns, incident=inc)
    taken = state.taken_out
    if inc.takes_out and not inc.held and not ns.out:
        ns = replace(ns, out=True)
        # Only a take-out that asks for a spare in its place removes capacity from service;
        # a spare pulled from the pool does not, so the breaker does not count it.
        if any(isinstance(a, PromoteSpare) for a in decision.actions):
            taken = frozen_map({**taken, event.node: now})
    return replace(state.with_node(event.node, ns), taken_out=taken)


def rebuild(history: Iterable[tuple[HealthEvent, float, Decision]]) -> PolicyState:
    """The state after the recorded ``(event, received_at, decision)`` triples, in order
    (receipt times in Unix seconds). Repairs and breaker resets are not events: a caller
    that has them applies :func:`recovery.policy.advance_repaired` and
    :func:`recovery.policy.breaker_reset` at their places in the sequence."""
    state = PolicyState.empty()
    for event, at, decision in history:
        state = advance(state, event, decision, at)
    return state
