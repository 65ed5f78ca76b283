"""``build_engine``: the one way an :class:`~recovery.coordinator.engine.Engine` is made, with
everything it works with given at construction (the coordinator's start-up, the tests and
the benchmarks all build it here). Nothing is handed to an engine afterwards."""

from __future__ import annotations

from collections.abc import Callable

from recovery.coordinator.engine import Engine, EngineSettings, Observer, Unobserved
from recovery.coordinator.executor import Executor
from recovery.coordinator.jobwatch import JobWatch
from recovery.coordinator.kube import KubeFollow
from recovery.coordinator.reconcile import Heartbeats
from recovery.coordinator.rules import Rules
from recovery.coordinator.validation import AgentReports, NodeClaims, Validator
from recovery.ports.checks import BurnIn, RepairChecker
from recovery.ports.clock import Clock
from recovery.ports.journal import Journal
from recovery.ports.nodes import NodeControl
from recovery.ports.slurm import NodeInfo, SlurmControl


def build_engine(
    *,
    journal: Journal,
    slurm: SlurmControl,
    clock: Clock,
    rules: Rules,
    settings: EngineSettings | None = None,
    log: Callable[[str], None] = lambda _msg: None,
    sleep: Callable[[float], None] | None = None,
    heartbeats: Heartbeats | None = None,
    checker: RepairChecker | None = None,
    nodes: NodeControl | None = None,
    observer: Observer | None = None,
    agents: AgentReports | None = None,
    burn_in: BurnIn | None = None,
) -> Engine:
    """An engine (not started) over ``journal`` and ``slurm`` deciding with ``rules``.

    ``settings``: ticks, batches, the executor's retries, Kubernetes (None: the defaults);
    ``sleep``: what retries wait with (None: real time); ``heartbeats``: the agents' heartbeat
    tracker (None: no agent is watched, no node becomes a suspect); ``checker``: runs the
    policy's ``repair_check`` (None: no repair checks); ``nodes``: Kubernetes (None: a
    Slurm-only cluster); ``observer``: is told of every event submitted and every batch of
    decisions committed (what the benchmarks stamp); ``agents``: what the agents reported of
    their nodes (the node checks' facts; None: every check fails its ``agent`` step);
    ``burn_in``: runs the burn-in jobs (None: checks skip it). The node checks follow the
    policy's ``validation`` settings.
    """
    settings = settings or EngineSettings()
    engines: list[Engine] = []  # the validator reads Slurm as the engine last did

    def seen_nodes() -> list[NodeInfo]:
        seen = engines[0].seen_nodes() if engines else ()
        return list(seen) if seen else slurm.nodes()  # before the engine's first read

    validator = Validator(
        journal=journal, clock=clock, agents=agents, burn_in=burn_in,
        settings=rules.config.validation, claims=NodeClaims(), nodes=seen_nodes, log=log,
    )  # fmt: skip
    kube = (
        None
        if nodes is None
        else KubeFollow(journal=journal, nodes=nodes, clock=clock, mode=settings.kube, log=log)
    )
    executor = Executor(
        journal=journal,
        slurm=slurm,
        clock=clock,
        settings=settings.executor,
        sleep=sleep,
        log=log,
        kube=kube,
        validator=validator,
    )
    watch = JobWatch(
        journal=journal,
        slurm=slurm,
        clock=clock,
        config=lambda: rules.config.requeue,
        log=log,
    )
    engine = Engine(
        journal=journal,
        slurm=slurm,
        clock=clock,
        rules=rules,
        executor=executor,
        watch=watch,
        settings=settings,
        log=log,
        kube=kube,
        heartbeats=heartbeats,
        checker=checker,
        observer=observer if observer is not None else Unobserved(),
        validator=validator,
    )
    engines.append(engine)
    return engine
