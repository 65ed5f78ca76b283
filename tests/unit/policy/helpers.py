"""Helpers for the policy tests: a small cluster view, events, and a driver that decides and
folds events at fake times (plain numbers)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from recovery.model import Decision, HealthEvent, Source
from recovery.policy import (
    Catalogue,
    ClusterView,
    PolicyConfig,
    PolicyState,
    advance,
    decide,
)
from recovery.pool.spares import SPARE_REASON
from recovery.ports.slurm import NodeInfo

#: Receipt times start here (Unix seconds); tests add offsets to it.
T0 = 1_800_000_000.0


def node(name: str, partition: str = "gpu", **kw: Any) -> NodeInfo:
    """An idle node in ``partition``."""
    return NodeInfo(name=name, state=kw.pop("state", "IDLE"), partitions=(partition,), **kw)


def spare(name: str, partition: str = "gpu", **kw: Any) -> NodeInfo:
    """A node held in the spare pool."""
    return node(name, partition, flags=frozenset({"DRAIN"}), reason=SPARE_REASON, **kw)


def cluster(n: int = 4, spares: int = 1, partition: str = "gpu") -> ClusterView:
    """``n`` nodes n1.. and ``spares`` spares s1.. in one partition."""
    infos = [node(f"n{i}", partition) for i in range(1, n + 1)]
    infos += [spare(f"s{i}", partition) for i in range(1, spares + 1)]
    return ClusterView.from_nodes(infos)


_ids = itertools.count(1)


def event(fault: str, node: str = "n1", **kw: Any) -> HealthEvent:
    """A valid event; ids are unique unless given."""
    kw.setdefault("id", f"ev-{next(_ids)}")
    kw.setdefault("source", Source.nvml)
    kw.setdefault("observed_at", T0)
    return HealthEvent(node=node, fault=fault, **kw)


@dataclass
class Run:
    """Decides events in order and folds each decision into the state, like the coordinator."""

    catalogue: Catalogue
    config: PolicyConfig = field(default_factory=PolicyConfig.default)
    view: ClusterView = field(default_factory=cluster)
    state: PolicyState = field(default_factory=PolicyState.empty)
    decisions: list[Decision] = field(default_factory=list)

    def send(self, fault: str, at: float = 0.0, node: str = "n1", **kw: Any) -> Decision:
        """Decide ``fault`` on ``node`` received ``at`` seconds after T0, and fold it."""
        return self.send_event(event(fault, node, **kw), at)

    def send_event(self, ev: HealthEvent, at: float = 0.0) -> Decision:
        now = T0 + at
        d = decide(self.state, ev, self.view, self.config, self.catalogue, now)
        self.state = advance(self.state, ev, d, now)
        self.decisions.append(d)
        return d
