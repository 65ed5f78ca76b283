"""A coordinator engine on a FakeSlurm, a real SQLite journal in a temp dir and a fake clock,
stepped by hand: what the engine's unit tests drive."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from recovery.coordinator.build import build_engine
from recovery.coordinator.engine import Engine, EngineSettings
from recovery.coordinator.executor import ExecutorSettings
from recovery.coordinator.kube import KubeMode
from recovery.coordinator.reconcile import Heartbeats
from recovery.coordinator.rules import Rules
from recovery.model import HealthEvent, Source
from recovery.policy import PolicyConfig, load_catalogue
from recovery.ports.checks import RepairChecker
from recovery.ports.clock import FakeClock
from recovery.ports.journal import IncidentRecord
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
        return build_engine(
            journal=self.journal,
            slurm=self.slurm,
            clock=self.clock,
            rules=Rules(self.config, CATALOGUE),
            settings=settings,
            log=self.logged.append,
            sleep=lambda _s: None,
            heartbeats=self.heartbeats,
            checker=self.checker,
            nodes=self.nodes,
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
