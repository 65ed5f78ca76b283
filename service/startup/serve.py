"""The coordinator's start-up: read the config, build the adapters, hand them to the core,
serve the API. The one place that knows every part of the coordinator.

The state dir's files: :mod:`recovery.statedir`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from recovery.coordinator.build import build_engine
from recovery.coordinator.engine import EngineSettings
from recovery.coordinator.executor import ExecutorSettings
from recovery.coordinator.kube import KubeMode
from recovery.coordinator.rules import Rules
from recovery.errors import UsageError
from recovery.policy import load_catalogue, load_policy_config
from recovery.ports.clock import SystemClock
from recovery.statedir import (
    ENDPOINT_FILE,
    JOURNAL_FILE,
    TOKENS_FILE,
    write_endpoint,
)
from service.httpapi.agents_api import AgentChannel
from service.httpapi.app import create_app
from service.httpapi.auth import generate_tokens, load_tokens
from service.httpapi.server import free_port, serve
from service.httpapi.workmetrics import MeteredJournal, WorkMetrics
from service.journaldb.journal import SqliteJournal
from service.startup.checks import CommandCheck
from service.startup.kubewatch import NodeWatch
from service.wiring import (
    KubeOptions,
    SlurmAccess,
    burn_in_runner,
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
    port = port or free_port(host)
    d = opts.state_dir.absolute()
    d.mkdir(parents=True, exist_ok=True)
    catalogue = load_catalogue()
    config = load_policy_config(opts.config, catalogue=catalogue)
    slurm = slurm_control(opts.slurm_conf, None, env, opts.slurm_access)
    # Built before Slurm is first asked anything: a bad Kubernetes setting fails at once.
    nodes = node_control(opts.kube) if opts.kube is not None else None
    tokens_path = d / TOKENS_FILE
    if tokens_path.exists():
        tokens = load_tokens(tokens_path)
    else:
        tokens = generate_tokens(tokens_path, [n.name for n in slurm.nodes()])
        log(f"coordinator: generated tokens for {len(tokens.nodes())} nodes in {tokens_path}")
    clock = SystemClock()
    store = SqliteJournal(d / JOURNAL_FILE, clock)
    work = WorkMetrics()
    journal = MeteredJournal(store, work)  # every write counted for /metrics
    dry_run = opts.dry_run or config.dry_run
    agents = AgentChannel.default(clock, catalogue.known(), config.progress)
    rules = Rules(config, catalogue)
    engine = build_engine(
        journal=journal,
        slurm=slurm,
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
        nodes=nodes,
        agents=agents.heartbeats,
        burn_in=burn_in_runner(opts.slurm_conf, env, opts.slurm_access, d / "burn-in", log),
    )
    app = create_app(
        journal=journal, tokens=tokens, coordinator=engine, clock=clock, agents=agents, work=work
    )
    engine.start()
    watch = None
    if nodes is not None:
        watch = NodeWatch(
            nodes=nodes, journal=journal, clock=clock, known=engine.node_names,
            submit=engine.submit, log=log,
        )  # fmt: skip
        watch.start()
    url = f"http://{host}:{port}"
    write_endpoint(d, url, os.getpid())
    mode = " (DRY RUN: decisions only)" if dry_run else ""
    if opts.kube is not None:
        where = "in-cluster" if opts.kube.in_cluster else str(opts.kube.kubeconfig)
        slinky = " (Slinky: drains through the operator)" if opts.kube.slinky else ""
        mode += f", Kubernetes {where}{slinky}"
    log(f"coordinator: serving {url}, journal {d / JOURNAL_FILE}, policy {rules.version}{mode}")
    try:
        serve(app, host, port, log_level="warning", on_stop=agents.broker.close)
    finally:
        if watch is not None:
            watch.stop()
        engine.stop()
        store.close()
        (d / ENDPOINT_FILE).unlink(missing_ok=True)
        log("coordinator: stopped")
