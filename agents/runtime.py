"""The node agent's runtime: sources -> deduplicator -> spool -> publisher -> acknowledged.

Threads (all started by :meth:`Agent.run`, all stopped by its ``stop`` event):

* one per source (``nvml``, ``kmsg``, ``tpu``): each hands events to :meth:`Agent.submit`;
* the pipeline (the thread that called :meth:`Agent.run`): the only owner of the
  Deduplicator; takes events off a queue, folds repeats, puts what passes into the Spool and
  wakes the publisher; flushes ended deduplication windows every ``flush_s``;
* the publisher (:mod:`agents.publisher`): spool -> ``POST /v1/events`` -> ack;
* heartbeats: ``POST /v1/heartbeat`` every ``heartbeat_s``;
* commands (with the ``inject`` source): long-polls ``GET /v1/agents/{node}/commands`` and
  carries out injections (:mod:`agents.inject`).

Nothing is lost across a kill: the kernel-log source re-reads the log from its start whenever
the agent starts (event ids are stable, so the coordinator drops what it already has), and
everything that passed the deduplicator is in the spool before it is sent. Only lines logged in
this boot before the node's *first* agent started are skipped (by kernel timestamp; the first
start writes ``boot_id monotonic-seconds`` to a marker in the spool directory): they are
history, and reporting an old XID 79 as new would take a repaired node out again. In a later
boot nothing is skipped. ``kmsg_from`` overrides this (``start``: skip nothing; ``end``: read
only what is appended after each start).

Stopping (SIGTERM): sources stop, the queue is drained, every open deduplication window is
flushed into the spool, one last delivery is tried, and the agent exits; what did not go out
stays spooled for the next start.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from agents.dedup import DEFAULT_WINDOW_S, Deduplicator
from agents.follow import DEV_KMSG, KmsgFollower
from agents.ids import read_boot_id
from agents.inject import Injector
from agents.link import CoordinatorLink, Refused
from agents.publisher import REJECTED_DIR, Publisher, RejectedStore
from agents.spool import Spool
from recovery.errors import TransientError, unknown_choice
from recovery.fsutil import atomic_write
from recovery.model import HealthEvent
from recovery.ports.clock import Clock, SystemClock
from recovery.retry import Backoff
from recovery.train.workload import DEFAULT_DIR, any_registered

Log = Callable[[str], None]
SOURCES = ("inject", "kmsg", "nvml", "tpu")
DEFAULT_SOURCES = ("nvml", "kmsg", "inject")
AGENT_VERSION = "0.1.0"
KMSG_FROM = ("auto", "end", "start")
#: In the spool directory: this agent has run on this node before (see the module docstring).
STARTED_MARKER = ".kmsg-started"
#: Command ids remembered as done (redeliveries are far younger than this many commands).
MAX_REMEMBERED = 1000


@dataclass(frozen=True)
class AgentConfig:
    """How one agent runs. Durations in seconds."""

    node: str
    coordinator: str
    token: str
    spool_dir: Path
    sources: tuple[str, ...] = DEFAULT_SOURCES
    kmsg_file: Path = DEV_KMSG
    kmsg_interval_s: float = 0.05
    """How often the kernel log is read: detection latency averages half of it."""
    buses: Mapping[str, int] = field(default_factory=dict)
    """NVML bus id -> GPU index, to fill in ``accelerator`` for kernel-log lines."""
    dedup_window_s: float = DEFAULT_WINDOW_S
    flush_s: float = 1.0
    heartbeat_s: float = 5.0
    poll_wait_s: float = 20.0
    """How long one command poll is held by the coordinator."""
    version: str = AGENT_VERSION
    tpu_workload_dir: Path = DEFAULT_DIR
    """Where TPU workloads keep their markers (:mod:`recovery.train.workload`)."""
    kmsg_from: str = "auto"
    """Where the kernel-log source starts: ``auto`` (see the module docstring), ``start``
    (everything) or ``end`` (only what is appended after each start)."""

    def __post_init__(self) -> None:
        if self.kmsg_from not in KMSG_FROM:
            raise unknown_choice("kernel-log start", self.kmsg_from, KMSG_FROM)
        for name in self.sources:
            if name not in SOURCES:
                raise unknown_choice("source", name, SOURCES)


def run_agent(agent: Agent, stop: threading.Event | None = None) -> None:
    """Run ``agent`` in this (main) thread until SIGTERM or SIGINT (or ``stop``)."""
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        agent.log(f"agent: {signal.Signals(signum).name}: stopping")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    agent.run(stop)


class Agent:
    """One node's agent; see the module docstring. ``nvml`` loads the pynvml module (None when
    unavailable); ``runtime_factory`` makes the TPU runtime client. Both are injected so tests
    and nodes without the libraries run the rest unchanged."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Clock | None = None,
        log: Log = print,
        boot_id: str | None = None,
        nvml: Callable[[Log], Any] | None = None,
        tpu_runtime: Callable[[], Any] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.log = log
        self.boot_id = boot_id or read_boot_id()
        self._nvml = nvml
        self._tpu_runtime = tpu_runtime
        self._queue: queue.Queue[tuple[HealthEvent, threading.Event | None]] = queue.Queue()
        self.spool = Spool(config.spool_dir, log=log)
        self.dedup = Deduplicator(self.clock, config.dedup_window_s)
        self.link = CoordinatorLink(config.coordinator, config.token, config.node)
        self.publisher = Publisher(
            self.spool,
            self.link,
            RejectedStore(config.spool_dir / REJECTED_DIR),
            log=log,
        )
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    def emit(self, event: HealthEvent) -> None:
        """Hand ``event`` to the pipeline (thread-safe; what sources call)."""
        self._queue.put((event, None))

    def submit(self, event: HealthEvent, timeout_s: float | None = None) -> bool:
        """Hand ``event`` to the pipeline (thread-safe). With ``timeout_s``, wait until it is
        spooled or folded; False when that took longer."""
        if timeout_s is None:
            self._queue.put((event, None))
            return True
        done = threading.Event()
        self._queue.put((event, done))
        return done.wait(timeout_s)

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set, then shut down as the module docstring says."""
        cfg = self.config
        self.log(
            f"agent {cfg.node}: sources {','.join(cfg.sources)}; spool {cfg.spool_dir} "
            f"({len(self.spool)} event(s) waiting); coordinator {cfg.coordinator}"
        )
        sources_stop, service_stop = threading.Event(), threading.Event()
        sources = self._start_sources(sources_stop, service_stop)
        self._start("publisher", lambda: self.publisher.run(service_stop, self._wake))
        self._start("heartbeat", lambda: self._heartbeats(service_stop))
        try:
            self._pipeline(stop)
        finally:
            sources_stop.set()
            for t in sources:
                t.join(timeout=5)
            self._drain()
            service_stop.set()
            self._wake.set()
            for t in self._threads:
                if t.name != "commands":  # a held long poll ends with the process
                    t.join(timeout=15)
            self._last_delivery()
            self.link.close()
            self.log(f"agent {cfg.node}: stopped; {len(self.spool)} event(s) left in the spool")

    # --- pipeline ------------------------------------------------------------------------

    def _pipeline(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                event, done = self._queue.get(timeout=self.config.flush_s)
            except queue.Empty:
                self._spool(self.dedup.flush())
                continue
            self._spool(self.dedup.offer(event))
            if done is not None:
                done.set()

    def _drain(self) -> None:
        while True:
            try:
                event, done = self._queue.get_nowait()
            except queue.Empty:
                break
            self._spool(self.dedup.offer(event))
            if done is not None:
                done.set()
        self._spool(self.dedup.drain())

    def _spool(self, events: list[HealthEvent]) -> None:
        if not events:
            return
        for event in events:
            try:
                self.spool.put(event)
            except OSError as e:  # disk full or read-only: say so, keep detecting
                self.log(f"agent: cannot spool {event.id} ({event.fault}): {e}")
        self._wake.set()

    def _last_delivery(self) -> None:
        try:
            self.publisher.send_pending()
        except TransientError as e:
            self.log(f"agent: last delivery failed ({e}); the events stay in the spool")

    # --- threads -------------------------------------------------------------------------

    def _start(self, name: str, target: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                target()
            except Exception as e:  # one broken source must not take the agent down
                self.log(f"agent: {name} stopped on an error: {type(e).__name__}: {e}")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _start_sources(
        self, stop: threading.Event, service_stop: threading.Event
    ) -> list[threading.Thread]:
        cfg, emit = self.config, self.emit
        started = []
        if "kmsg" in cfg.sources:
            follower = KmsgFollower(
                cfg.node,
                self.boot_id,
                self.clock,
                path=cfg.kmsg_file,
                buses=cfg.buses,
                from_start=cfg.kmsg_from != "end",
                skip_before=self._history_ends() if cfg.kmsg_from == "auto" else None,
                log=self.log,
                agent_version=cfg.version,
            )
            started.append(
                self._start("kmsg", lambda: follower.run(emit, stop, cfg.kmsg_interval_s))
            )
        if "nvml" in cfg.sources:
            started.append(self._start("nvml", lambda: self._run_nvml(stop)))
        if "tpu" in cfg.sources:
            started.append(self._start("tpu", lambda: self._run_tpu(stop)))
        if "inject" in cfg.sources:
            self._start("commands", lambda: self._commands(service_stop))
        return started

    def _history_ends(self) -> float | None:
        """Kernel time (seconds since boot) before which lines are history: when this node's
        first agent started, if that was in this boot; None in a later boot. The first start
        records it (see the module docstring)."""
        marker = self.config.spool_dir / STARTED_MARKER
        try:
            boot, mono = marker.read_text().split()
            return float(mono) if boot == self.boot_id else None
        except (OSError, ValueError):  # no marker (first start) or a damaged one
            now = self.clock.now().mono
            atomic_write(marker, f"{self.boot_id} {now:.6f}\n".encode())
            return now

    def _run_nvml(self, stop: threading.Event) -> None:
        from agents.nvml import NvmlSource, load_pynvml  # pynvml only where it is used

        module = (self._nvml or load_pynvml)(self.log)
        if module is None:
            return
        cfg = self.config
        NvmlSource(
            cfg.node, self.boot_id, self.clock, module, log=self.log, agent_version=cfg.version
        ).run(self.emit, stop)

    def _run_tpu(self, stop: threading.Event) -> None:
        from agents.tpu import TpuSource

        if self._tpu_runtime is None:
            from agents.tpu_grpc import GrpcTpuRuntime

            runtime: Any = GrpcTpuRuntime()
        else:
            runtime = self._tpu_runtime()
        cfg = self.config
        # A workload is registered while `recover train` on TPUs keeps its marker there.
        markers = cfg.tpu_workload_dir
        TpuSource(
            cfg.node, self.boot_id, self.clock, runtime, lambda: any_registered(markers),
            log=self.log, agent_version=cfg.version,
        ).run(self.emit, stop)  # fmt: skip

    def _heartbeats(self, stop: threading.Event) -> None:
        said = False
        while not stop.is_set():
            try:
                self.link.heartbeat(self.config.version, {"spooled": len(self.spool)})
                said = False
            except (TransientError, Refused) as e:
                if not said:  # one line per outage, not one per beat
                    self.log(f"agent: heartbeat failed: {e}")
                    said = True
            stop.wait(self.config.heartbeat_s)

    def _commands(self, stop: threading.Event) -> None:
        cfg = self.config
        link = CoordinatorLink(cfg.coordinator, cfg.token, cfg.node)
        injector = Injector(
            cfg.node,
            self.boot_id,
            self.clock,
            lambda e: self.submit(e, timeout_s=5.0),
            cfg.kmsg_file if "kmsg" in cfg.sources else None,
            cfg.buses,
            cfg.version,
        )
        CommandLoop(link, injector, self.log).run(stop, cfg.poll_wait_s)


@dataclass
class CommandLoop:
    """Long-polls for commands, carries each out once, acknowledges it (again, when the
    coordinator hands out one it already did: its acknowledgement was lost)."""

    link: CoordinatorLink
    injector: Injector
    log: Log
    backoff: Backoff = field(default_factory=lambda: Backoff(2**31, initial_s=0.2, max_s=10.0))
    done: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run(self, stop: threading.Event, wait_s: float) -> None:
        failures = 0
        while not stop.is_set():
            try:
                for command in self.link.poll_commands(wait_s):
                    self.handle(command)
                failures = 0
            except Refused as e:  # a wrong token or node: say so, and ask again only rarely
                failures += 1
                if failures == 1:
                    self.log(f"agent: command channel refused: {e}; asking again every 30 s")
                stop.wait(30.0)
            except TransientError as e:
                failures += 1
                if failures == 1:
                    self.log(f"agent: command channel: {e}; retrying")
                stop.wait(self.backoff.wait_s(min(failures, 64), e))

    def handle(self, command: dict[str, Any]) -> None:
        cid = str(command.get("id"))
        result = self.done.get(cid)
        if result is None:
            if command.get("kind") == "inject":
                result = self.injector.carry_out(command)
            else:
                result = {"error": f"unknown command kind {command.get('kind')!r}; known: inject"}
            self.done[cid] = result
            while len(self.done) > MAX_REMEMBERED:  # oldest first: dicts keep insertion order
                del self.done[next(iter(self.done))]
            self.log(f"agent: command {cid} {command.get('kind')} {command.get('args')}: {result}")
        self.link.ack_command(cid, result)
