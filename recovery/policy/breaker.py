"""The circuit breaker: a bound on how many nodes the policy takes out per sliding window.

NVSentinel's semantics, with the fixes its users asked for: at most ``max_nodes`` nodes and at
most ``max_fraction`` of a partition are taken out (drain-reset or replace) per window; beyond
that a decision is *held* (its actions are recorded, not applied). Once anything is held the
breaker is tripped and holds every new take-out until an operator resets it; it never resets
itself. A reset applies the held decisions that are younger than ``hold_max_age_s`` and expires
the rest, instead of replaying days-old events. restart-app, ignore and repairs are never held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from recovery.policy.config import PolicyConfig
from recovery.policy.state import ClusterView, PolicyState, frozen_map


@dataclass(frozen=True)
class PartitionLoad:
    """One partition's share of the window: ``taken_out`` of ``size`` nodes, ``limit`` allowed."""

    partition: str
    size: int
    limit: int
    taken_out: int


@dataclass(frozen=True)
class BreakerStatus:
    """Where the breaker stands at ``now``. Times are Unix seconds.

    ``since`` is where the window starts (``now - window_s``, or the last reset if later);
    ``taken_out`` lists ``(node, time)`` taken out since then, oldest first; ``held`` lists the
    incidents whose take-outs are held. ``tripped`` is true while anything is held.
    """

    window_s: float
    max_nodes: int
    max_fraction: float
    hold_max_age_s: float
    since: float
    taken_out: tuple[tuple[str, float], ...]
    partitions: tuple[PartitionLoad, ...]
    held: tuple[str, ...]
    tripped: bool
    reset_at: float | None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "window_s": self.window_s,
            "max_nodes": self.max_nodes,
            "max_fraction": self.max_fraction,
            "hold_max_age_s": self.hold_max_age_s,
            "since": self.since,
            "taken_out": [{"node": n, "at": t} for n, t in self.taken_out],
            "partitions": [vars(p) for p in self.partitions],
            "held": list(self.held),
            "tripped": self.tripped,
            "reset_at": self.reset_at,
        }


def window_start(state: PolicyState, config: PolicyConfig, now: float) -> float:
    """Unix seconds where the sliding window starts at ``now``."""
    since = now - config.breaker.window_s
    return since if state.reset_at is None else max(since, state.reset_at)


def in_window(state: PolicyState, config: PolicyConfig, now: float) -> dict[str, float]:
    """Nodes taken out within the window -> when. A take-out at the reset instant itself
    (a held decision released by the reset) does not count: the operator chose it."""
    since = window_start(state, config, now)
    return {
        n: t
        for n, t in state.taken_out.items()
        if t >= since and (state.reset_at is None or t > state.reset_at) and t <= now
    }


def partition_limit(size: int, config: PolicyConfig) -> int:
    """Nodes of a partition of ``size`` nodes that may be out per window: ``max_fraction`` of
    it, rounded down, but at least one (else a small partition could never recover)."""
    return max(1, math.floor(config.breaker.max_fraction * size + 1e-9))


def hold_reason(
    state: PolicyState, node: str, view: ClusterView, config: PolicyConfig, now: float
) -> str | None:
    """Why taking ``node`` out now would be held, or None when it may go ahead.

    A node already out, or already counted in the window, does not count twice.
    """
    if state.node(node).out:
        return None
    count, first = state.first_held()
    if count:
        return (
            f"breaker tripped: {count} take-out(s) already held (first {first}); "
            "an operator resets it with recover breaker reset"
        )
    window = in_window(state, config, now)
    if node in window:
        return None
    b = config.breaker
    if len(window) + 1 > b.max_nodes:
        return (
            f"breaker: {len(window)} node(s) already taken out in the last {b.window_s:g} s, "
            f"limit {b.max_nodes}"
        )
    sizes = view.partition_sizes
    for part in view.partitions_of(node):
        limit = partition_limit(sizes.get(part, 1), config)
        if len(window) + 1 <= limit:
            # No partition can hold more of the window than the whole window: no need to
            # count (counting on every decision of a storm made the storm quadratic).
            continue
        count = sum(1 for n in window if part in view.partitions_of(n))
        if count + 1 > limit:
            return (
                f"breaker: {count} of {sizes.get(part, 1)} node(s) of partition {part} already "
                f"taken out in the last {b.window_s:g} s, limit {limit} "
                f"({b.max_fraction:g} of the partition)"
            )
    return None


def breaker_status(
    state: PolicyState, view: ClusterView, config: PolicyConfig, now: float
) -> BreakerStatus:
    """The breaker's window, limits, what it counts and what it holds at ``now``."""
    window = in_window(state, config, now)
    sizes = view.partition_sizes
    loads = tuple(
        PartitionLoad(
            partition=part,
            size=size,
            limit=partition_limit(size, config),
            taken_out=sum(1 for n in window if part in view.partitions_of(n)),
        )
        for part, size in sorted(sizes.items())
    )
    held = tuple(inc.id for _, inc in state.held_incidents())
    b = config.breaker
    return BreakerStatus(
        window_s=b.window_s,
        max_nodes=b.max_nodes,
        max_fraction=b.max_fraction,
        hold_max_age_s=b.hold_max_age_s,
        since=window_start(state, config, now),
        taken_out=tuple(sorted(window.items(), key=lambda p: (p[1], p[0]))),
        partitions=loads,
        held=held,
        tripped=bool(held),
        reset_at=state.reset_at,
    )


def split_held(
    state: PolicyState, now: float, config: PolicyConfig | None = None
) -> tuple[list[str], list[str]]:
    """``(released, expired)`` incident ids a reset at ``now`` would apply or expire: held
    incidents opened at most ``hold_max_age_s`` seconds ago are released."""
    max_age = (config or PolicyConfig.default()).breaker.hold_max_age_s
    released: list[str] = []
    expired: list[str] = []
    for _, inc in state.held_incidents():
        (released if now - inc.opened_at <= max_age else expired).append(inc.id)
    return released, expired


def breaker_reset(
    state: PolicyState, now: float, config: PolicyConfig | None = None
) -> PolicyState:
    """The state after an operator reset the breaker at ``now`` (Unix seconds).

    The window starts afresh; held incidents young enough (see :func:`split_held`, with
    ``config``'s ``hold_max_age_s``, the default when None) take their nodes out now, the rest
    are dropped (the nodes stay in service; their failures stay in the history).
    """
    released, _ = split_held(state, now, config)
    nodes = dict(state.nodes)
    taken = dict(state.taken_out)
    for name, inc in state.held_incidents():
        ns = nodes[name]
        if inc.id in released:
            nodes[name] = replace(ns, incident=replace(inc, held=False), out=True)
            taken[name] = now
        else:
            nodes[name] = replace(ns, incident=None)
    return PolicyState(nodes=frozen_map(nodes), taken_out=frozen_map(taken), reset_at=now)
