"""A coordinator engine on a FakeSlurm, a real SQLite journal in a temp dir and a fake clock,
stepped by hand: what the engine's unit tests drive."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.coordinator.build import build_engine
from recovery.coordinator.engine import Engine, EngineSettings
from recovery.coordinator.executor import ExecutorSettings
from recovery.coordinator.fenced import Fence, FencedNodes, FencedSlurm
from recovery.coordinator.kube import KubeMode
from recovery.coordinator.reconcile import Heartbeats
from recovery.coordinator.rules import Rules
from recovery.coordinator.validation import AgentReports, NodeClaims
from recovery.model import HealthEvent, Source
from recovery.policy import PolicyConfig, load_catalogue
from recovery.ports.checks import BurnIn, BurnInOutcome, RepairChecker
from recovery.ports.clock import FakeClock
from recovery.ports.journal import IncidentRecord
from recovery.ports.nodes import NodeControl
from recovery.ports.slurm import SlurmControl
from recovery.retry import Backoff
from service.journaldb.journal import SqliteJournal
from tests.fakes.nodes import FakeNodes
from tests.fakes.slurm import FakeSlurm

CATALOGUE = load_catalogue()
_ids = itertools.count(1)


def event(node: str, fault: str = "xid79", **kw: object) -> HealthEvent:
    """A health event with a fresh id, observed now (the clock is set by the caller)."""
    fields: dict[str, object] = {
        "id": f"ev-{next(_ids)}",
        "node": node,
        "source": Source.nvml,
        "fault": fault,
        "observed_at": 1_800_000_000.0 - 0.5,  # half a second before FakeClock's start
    }
    fields.update(kw)
    return HealthEvent.model_validate(fields)


@dataclass
class Rig:
    """One coordinator: ``slurm``, ``journal``, ``clock``, ``engine`` (and ``nodes``, the
    Kubernetes side, when given)."""

    path: Path
    slurm: FakeSlurm
    config: PolicyConfig = field(default_factory=PolicyConfig.default)
    dry_run: bool = False
    clock: FakeClock = field(default_factory=FakeClock)
    nodes: FakeNodes | None = None
    """Kubernetes, when the test wants it (None: a Slurm-only cluster)."""
    kube: KubeMode = field(default_factory=lambda: KubeMode(view_every_s=0.0))
    heartbeats: Heartbeats | None = None
    checker: RepairChecker | None = None
    agents: AgentReports | None = None
    """What the agents reported (the node checks' facts)."""
    burn_in: BurnIn | None = None
    fence: Fence | None = None
    """Asked before every Slurm or Kubernetes action (a replica's lease), when given."""
    logged: list[str] = field(default_factory=list)
    """What the engine logged."""

    def __post_init__(self) -> None:
        self.slurm.wall = lambda: self.clock.now().wall  # jobs end on the test's clock
        self.journal = SqliteJournal(self.path, self.clock, checkpoint_every_s=None)
        self.engine = self._engine()

    def _engine(self) -> Engine:
        settings = EngineSettings(
            executor=ExecutorSettings(
                backoff=Backoff(attempts=2, initial_s=0.0, max_s=0.0),
                max_attempts=3,
                dry_run=self.dry_run,
            ),
            kube=self.kube,
        )
        slurm: SlurmControl = self.slurm
        nodes: NodeControl | None = self.nodes
        if self.fence is not None:
            slurm = FencedSlurm(self.slurm, self.fence)
            nodes = FencedNodes(self.nodes, self.fence) if self.nodes is not None else None
        return build_engine(
            journal=self.journal,
            slurm=slurm,
            clock=self.clock,
            rules=Rules(self.config, CATALOGUE),
            settings=settings,
            log=self.logged.append,
            sleep=lambda _s: None,
            heartbeats=self.heartbeats,
            checker=self.checker,
            nodes=nodes,
            agents=self.agents,
            burn_in=self.burn_in,
        )

    def send(self, *events: HealthEvent, step: bool = True) -> None:
        """Commit ``events`` as the intake would, then run one engine step."""
        self.journal.append_events(list(events), self.clock.now())
        self.clock.advance(0.01)  # the engine decides a moment after receipt
        if step:
            self.engine.step()

    def restart(self) -> Engine:
        """A new coordinator process on the same journal and Slurm (the old one was killed)."""
        self.journal.close()
        self.journal = SqliteJournal(self.path, self.clock, checkpoint_every_s=None)
        self.engine = self._engine()
        self.engine.recover()
        return self.engine

    def incident(self, node: str) -> IncidentRecord:
        """The newest incident on ``node``."""
        found = [i for i in self.journal.incidents() if i.node == node]
        assert found, f"no incident on {node}"
        return found[-1]

    def phases(self, node: str) -> list[str]:
        """The names of the newest incident's phases on ``node``, in time order."""
        return [p.name.value for p in sorted(self.incident(node).phases, key=lambda p: p.at.mono)]


class FakeAgents:
    """What agents reported: heartbeats on ``clock`` and accelerators."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.seen: dict[str, float] = {}
        self.reported: dict[str, dict[str, Any]] = {}

    def beat(self, node: str, accelerators: dict[str, Any] | None = None) -> None:
        self.seen[node] = self.clock.now().mono
        if accelerators is not None:
            self.reported[node] = accelerators

    def last_seen(self, node: str) -> float | None:
        return self.seen.get(node)

    def accelerators(self, node: str) -> Mapping[str, Any] | None:
        return self.reported.get(node)


class FakeBurnIn:
    """A burn-in that passes (``ok``) or fails without running anything; records its runs."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.runs: list[tuple[str, float, str]] = []
        self.claims: NodeClaims | None = None
        self.held_by: list[str | None] = []
        self.peers: list[tuple[str, str] | None] = []
        self.peer_held_by: list[str | None] = []

    def run(
        self,
        node: str,
        budget_s: float,
        restore_reason: str,
        expect_devices: int | None = None,
        peer: tuple[str, str] | None = None,
    ) -> BurnInOutcome:
        self.runs.append((node, budget_s, restore_reason))
        self.peers.append(peer)
        if self.claims is not None:
            self.held_by.append(self.claims.holder(node))
            if peer is not None:
                self.peer_held_by.append(self.claims.holder(peer[0]))
        return BurnInOutcome(self.ok, "burned" if self.ok else "the product was wrong", "7", 2.5)

    def cleanup(self, restore_reasons: Mapping[str, str]) -> list[str]:
        return sorted(restore_reasons)
