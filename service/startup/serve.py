"""The coordinator's start-up: read the config, build the adapters, hand them to the core,
serve the API. The one place that knows every part of the coordinator.

The state dir's files: :mod:`recovery.statedir`.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.coordinator.api import CoordinatorApi
from recovery.coordinator.build import build_engine
from recovery.coordinator.engine import Engine, EngineSettings
from recovery.coordinator.executor import ExecutorSettings
from recovery.coordinator.fenced import Fence, FencedBurnIn, FencedNodes, FencedSlurm
from recovery.coordinator.kube import KubeMode
from recovery.coordinator.leader import Elector
from recovery.coordinator.replica import Replica, Role
from recovery.coordinator.rules import Rules
from recovery.errors import UsageError
from recovery.model import HealthEvent
from recovery.policy import load_catalogue, load_policy_config
from recovery.ports.clock import SystemClock
from recovery.ports.slurm import SlurmControl
from recovery.statedir import (
    ENDPOINT_FILE,
    JOURNAL_FILE,
    TOKENS_FILE,
    read_endpoint,
    write_endpoint,
)
from service.httpapi.agents_api import AgentChannel
from service.httpapi.app import create_app
from service.httpapi.auth import TokenTable, generate_tokens, load_tokens
from service.httpapi.server import free_port, serve
from service.httpapi.workmetrics import MeteredJournal, WorkMetrics
from service.journaldb.journal import SqliteJournal
from service.journaldb.sqljournal import SqlJournal
from service.startup.checks import CommandCheck
from service.startup.kubewatch import NodeWatch
from service.wiring import (
    KubeOptions,
    LeaseOptions,
    SlurmAccess,
    burn_in_runner,
    check_lease,
    lease_store,
    node_control,
    slurm_control,
)


@dataclass(frozen=True)
class ServeOptions:
    """``recover coordinator serve`` options."""

    state_dir: Path
    listen: str = "127.0.0.1:8470"
    """``HOST:PORT``; port 0 picks a free one (recorded in coordinator.json)."""
    slurm_conf: str | None = None
    config: Path | None = None
    dry_run: bool = False
    tick_s: float = 0.5
    """Seconds between reconcile ticks (Slurm is polled once per tick)."""
    kube: KubeOptions | None = None
    """Kubernetes (Slurm on Kubernetes): None for a Slurm-only cluster."""
    slurm_access: SlurmAccess = field(default_factory=SlurmAccess)
    """Which Slurm backend, and how it reaches slurmrestd or authenticates (``--slurm-*``)."""
    journal_dsn: str | None = None
    """The journal in this PostgreSQL database (``--journal-dsn``) instead of the state dir's
    SQLite file: what replicas on several machines share."""
    lease: LeaseOptions | None = None
    """One replica of several, leading while it holds this lease (``--lease``); None: the
    only coordinator, acting from the start."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port). Raises UsageError naming the expected form."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"Invalid --listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8470")
    return host, int(port)


def run_coordinator(
    opts: ServeOptions,
    *,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> None:
    """Serve until SIGTERM/SIGINT. Raises UsageError for bad options or files (tokens, policy
    config, no Slurm configured), JournalError when the journal cannot be opened."""
    env = os.environ if env is None else env
    host, port = parse_listen(opts.listen)
    if opts.lease is not None:
        check_lease(opts.lease, opts.kube)  # before Slurm is asked anything
    port = port or free_port(host)
    d = opts.state_dir.absolute()
    d.mkdir(parents=True, exist_ok=True)
    catalogue = load_catalogue()
    config = load_policy_config(opts.config, catalogue=catalogue)
    slurm = slurm_control(opts.slurm_conf, None, env, opts.slurm_access)
    # Built before Slurm is first asked anything: a bad Kubernetes setting fails at once.
    nodes = node_control(opts.kube) if opts.kube is not None else None
    tokens = _tokens(d / TOKENS_FILE, slurm, log)
    clock = SystemClock()
    store: SqlJournal
    if opts.journal_dsn:
        from service.journaldb.pgjournal import PostgresJournal

        store = PostgresJournal(opts.journal_dsn, clock)
        journal_where = store.where
    else:
        store = SqliteJournal(d / JOURNAL_FILE, clock)
        journal_where = str(d / JOURNAL_FILE)
    work = WorkMetrics()
    journal = MeteredJournal(store, work)  # every write counted for /metrics
    dry_run = opts.dry_run or config.dry_run
    agents = AgentChannel.default(clock, catalogue.known(), config.progress)
    burn_in = burn_in_runner(opts.slurm_conf, env, opts.slurm_access, d / "burn-in", log)
    url = f"http://{host}:{port}"

    def start(fence: Fence | None) -> _Running:
        """The engine (and the Kubernetes watch beside it), fenced when ``fence`` is given.
        Built whole each time: a new leader's engine starts from the journal alone."""
        rules = Rules(config, catalogue)
        watched_nodes = nodes
        fenced_slurm: SlurmControl = slurm
        fenced_burn_in = burn_in
        if fence is not None:
            fenced_slurm = FencedSlurm(slurm, fence)
            watched_nodes = FencedNodes(nodes, fence) if nodes is not None else None
            fenced_burn_in = FencedBurnIn(burn_in, fence) if burn_in is not None else None
        engine = build_engine(
            journal=journal,
            slurm=fenced_slurm,
            clock=clock,
            rules=rules,
            settings=EngineSettings(
                tick_s=opts.tick_s,
                executor=ExecutorSettings(dry_run=dry_run),
                kube=KubeMode(via_operator=opts.kube is not None and opts.kube.slinky),
            ),
            log=log,
            heartbeats=agents.heartbeats,
            checker=None if config.repair_check is None else CommandCheck(config.repair_check, log),
            nodes=watched_nodes,
            agents=agents.heartbeats,
            burn_in=fenced_burn_in,
        )
        watch = None
        if watched_nodes is not None:
            watch = NodeWatch(
                nodes=watched_nodes, journal=journal, clock=clock, known=engine.node_names,
                submit=engine.submit, log=log,
            )  # fmt: skip
        return _Running(engine, watch, rules.version)

    replica: Replica | None = None
    if opts.lease is None:
        running = start(None)
        coordinator: CoordinatorApi = running
        role = None
        running.start()
        write_endpoint(d, url, os.getpid())
        policy = running.policy
    else:
        elector = Elector(
            lease_store(opts.lease, opts.kube, d / JOURNAL_FILE, opts.journal_dsn),
            opts.lease.identity,
            time.monotonic,
            time.time,
            duration_s=opts.lease.duration_s,
            renew_deadline_s=opts.lease.renew_deadline_s,
            retry_s=opts.lease.retry_s,
        )

        def changed(now: Role) -> None:
            if now.role == "leader":  # local commands find the leader in the state dir
                write_endpoint(d, url, os.getpid())

        replica = Replica(elector, lambda: start(elector.fence), log=log, on_change=changed)
        coordinator = replica
        role = replica.role
        policy = Rules(config, catalogue).version
    app = create_app(
        journal=journal, tokens=tokens, coordinator=coordinator, clock=clock, agents=agents,
        work=work, role=role,
    )  # fmt: skip
    if replica is not None:
        replica.start()
        assert opts.lease is not None
        log(
            f"coordinator: replica {opts.lease.identity} of {elector.store.where}: "
            f"{replica.role().role}"
        )
    mode = " (DRY RUN: decisions only)" if dry_run else ""
    if opts.kube is not None:
        where = "in-cluster" if opts.kube.in_cluster else str(opts.kube.kubeconfig)
        slinky = " (Slinky: drains through the operator)" if opts.kube.slinky else ""
        mode += f", Kubernetes {where}{slinky}"
    log(f"coordinator: serving {url}, journal {journal_where}, policy {policy}{mode}")
    try:
        serve(app, host, port, log_level="warning", on_stop=agents.broker.close)
    finally:
        if replica is not None:
            replica.stop()
        else:
            running.stop()
        store.close()
        ep = read_endpoint(d)
        if ep is not None and ep.pid == os.getpid():
            (d / ENDPOINT_FILE).unlink(missing_ok=True)
        log("coordinator: stopped")


def _tokens(path: Path, slurm: SlurmControl, log: Callable[[str], None]) -> TokenTable:
    """The tokens file's table, made first when there is none. Under a lock beside it:
    replicas started together in one state dir make one table, not one each."""
    with open(path.with_name(".tokens.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return load_tokens(path)
        tokens = generate_tokens(path, [n.name for n in slurm.nodes()])
        log(f"coordinator: generated tokens for {len(tokens.nodes())} nodes in {path}")
        return tokens


class _Running:
    """An engine and the Kubernetes watch beside it, started and stopped together (what a
    replica runs while it leads). Answers the coordinator API through the engine."""

    def __init__(self, engine: Engine, watch: NodeWatch | None, policy: str) -> None:
        self.engine = engine
        self.watch = watch
        self.policy = policy

    def start(self) -> None:
        self.engine.start()
        if self.watch is not None:
            self.watch.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.engine.stop(timeout_s)

    def submit(self, events: Sequence[HealthEvent]) -> None:
        self.engine.submit(events)

    def nodes(self) -> list[dict[str, Any]]:
        return self.engine.nodes()

    def status(self) -> dict[str, Any]:
        return self.engine.status()

    def repaired(self, node: str) -> dict[str, Any]:
        return self.engine.repaired(node)

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        return self.engine.check_node(node, burn_in=burn_in, force=force)

    def look_at_node(self, node: str) -> dict[str, Any]:
        return self.engine.look_at_node(node)

    def breaker(self) -> dict[str, Any]:
        return self.engine.breaker()

    def breaker_reset(self) -> dict[str, Any]:
        return self.engine.breaker_reset()
