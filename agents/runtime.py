"""The node agent's runtime: sources -> deduplicator -> spool -> publisher -> acknowledged.

Threads (all started by :meth:`Agent.run`, all stopped by its ``stop`` event):

* one per source (``nvml``, ``kmsg``, ``journald``, ``tpu``, ``progress``): each hands events
  to :meth:`Agent.submit`;
* the pipeline (the thread that called :meth:`Agent.run`): the only owner of the
  Deduplicator; takes events off a queue, folds repeats, puts what passes into the Spool and
  wakes the publisher; flushes ended deduplication windows every ``flush_s``; saves the
  kernel-log sources' read marks once their lines' events are settled;
* the publisher (:mod:`agents.publisher`): spool -> ``POST /v1/events`` -> ack;
* heartbeats: ``POST /v1/heartbeat`` every ``heartbeat_s``;
* commands (with the ``inject`` source): long-polls ``GET /v1/agents/{node}/commands`` and
  carries out injections (:mod:`agents.inject`).

Boot replay and restarts: a kernel-log source (``kmsg``, ``journald``) reads the current
boot's log from its start, so a fault logged before the agent started (a monitor that comes up
after the XID, as after a reboot) is reported once. Each source's read mark
(:mod:`agents.readmark`: the boot id and the record sequence number, file offset or journal
cursor of the last line whose event is settled) is saved in the spool directory, and a
restart in the same boot goes on after it: no line is reported twice. Everything that
passed the deduplicator is in the spool before it is sent, so a kill loses nothing either:
lines after the saved mark are read again, with the same event ids. ``kmsg_from`` overrides
this: ``start`` reads the whole boot again whatever the mark says, ``end`` only what is
appended after each start (it loses what was logged while no agent ran).

Stopping (SIGTERM): sources stop, the queue is drained, every open deduplication window is
flushed into the spool, one last delivery is tried, and the agent exits; what did not go out
stays spooled for the next start.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from agents.accel import AcceleratorSummary
from agents.commands import CommandLoop
from agents.dedup import DEFAULT_WINDOW_S, Deduplicator
from agents.follow import DEV_KMSG, KmsgFollower
from agents.ids import read_boot_id
from agents.inject import Injector
from agents.journald import JournaldSource
from agents.link import CoordinatorLink, Refused
from agents.metrics import AgentMetrics
from agents.publisher import REJECTED_DIR, Publisher, RejectedStore
from agents.readmark import MARK_FILES, Mark, MarkFile
from agents.spool import Spool
from recovery.contract.workload import DEFAULT_DIR, any_registered
from recovery.errors import TransientError, UsageError, unknown_choice
from recovery.model import HealthEvent
from recovery.ports.clock import Clock, SystemClock
from recovery.progress.registry import registry_dir

if TYPE_CHECKING:
    from agents.progress import ProgressSource

Log = Callable[[str], None]
#: A queued event, the Event to set once it is settled, and the read mark of its line.
_Item = tuple[HealthEvent, threading.Event | None, tuple[MarkFile, Mark] | None]
SOURCES = ("inject", "journald", "kmsg", "nvml", "progress", "tpu")
DEFAULT_SOURCES = ("nvml", "kmsg", "inject", "progress")
AGENT_VERSION = "0.1.0"
KMSG_FROM = ("auto", "end", "start")
#: Read marks are saved (fsynced) at most this often while lines keep coming, in seconds, and
#: within ``flush_s`` once they stop; a crash in between reads those lines again.
MARK_SAVE_S = 0.5


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
    """Where TPU workloads keep their markers (:mod:`recovery.contract.workload`)."""
    kmsg_from: str = "auto"
    """Where the kernel-log sources start: ``auto`` (this boot's log from its start, after
    the saved read mark), ``start`` (this boot's log from its start, whatever the mark says)
    or ``end`` (only what is appended after each start)."""
    journalctl: tuple[str, ...] = ("journalctl",)
    """The command the ``journald`` source runs (``journalctl`` on PATH by default)."""
    progress_registry: Path = field(default_factory=lambda: registry_dir(os.environ))
    """Where training processes on this node register their progress records
    (``$RECOVER_PROGRESS_REGISTRY``, else ``/run/recover/progress``)."""
    progress_interval_s: float = 1.0
    """How often the ``progress`` source looks at the jobs' records."""
    simulated_gpus: int = 0
    """GPUs a local (simulated) node says it has in its heartbeats' ``accelerators`` (NVML's
    count replaces it where NVML runs)."""
    metrics_listen: tuple[str, int] | None = None
    """Where to serve the agent's ``/metrics`` (:mod:`agents.metrics`); None: nowhere."""

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
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._marks: list[MarkFile] = []
        self._progress: ProgressSource | None = None  # the progress source, once started
        self._marks_due = 0.0  # monotonic seconds: when the read marks may be saved again
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
        simulated = config.simulated_gpus
        self.accelerators = (
            AcceleratorSummary("simulated", simulated) if simulated else AcceleratorSummary()
        )
        self.beat_at: float | None = None
        """When (monotonic seconds) the coordinator last answered a heartbeat."""
        self.metrics: AgentMetrics | None = None
        """Counted only when served (``metrics_listen``)."""
        if config.metrics_listen is not None:
            self.metrics = AgentMetrics(
                spooled=lambda: len(self.spool),
                last_post=lambda: self.publisher.stats.delivered_at,
                last_beat=lambda: self.beat_at,
            )

    def emit(self, event: HealthEvent) -> None:
        """Hand ``event`` to the pipeline (thread-safe; what sources call)."""
        self._queue.put((event, None, None))

    def emit_marked(self, marks: MarkFile, event: HealthEvent, mark: Mark) -> None:
        """Hand ``event`` to the pipeline; once it is spooled (or folded), ``mark`` (where its
        line lies in the kernel log) is noted in ``marks`` to be saved (thread-safe)."""
        self._queue.put((event, None, (marks, mark)))

    def submit(self, event: HealthEvent, timeout_s: float | None = None) -> bool:
        """Hand ``event`` to the pipeline (thread-safe). With ``timeout_s``, wait until it is
        spooled or folded; False when that took longer."""
        if timeout_s is None:
            self._queue.put((event, None, None))
            return True
        done = threading.Event()
        self._queue.put((event, done, None))
        return done.wait(timeout_s)

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set, then shut down as the module docstring says."""
        cfg = self.config
        self.log(
            f"agent {cfg.node}: sources {','.join(cfg.sources)}; spool {cfg.spool_dir} "
            f"({len(self.spool)} event(s) waiting); coordinator {cfg.coordinator}"
        )
        if cfg.metrics_listen is not None and self.metrics is not None:
            host, port = cfg.metrics_listen
            try:
                self.metrics.serve(host, port)
            except OSError as e:  # the port is taken, the address is not this host's
                raise UsageError(f"--metrics-listen {host}:{port}: cannot serve there: {e}") from e
            self.log(f"agent {cfg.node}: metrics at http://{cfg.metrics_listen[0]}:"
                     f"{cfg.metrics_listen[1]}/metrics")  # fmt: skip
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
                item = self._queue.get(timeout=self.config.flush_s)
            except queue.Empty:
                self._spool(self.dedup.flush())
                self._save_marks()
                continue
            self._settle(item)
            if self._queue.empty() and self.clock.now().mono >= self._marks_due:
                self._save_marks()  # at most every MARK_SAVE_S while lines keep coming

    def _settle(self, item: _Item) -> None:
        event, done, marked = item
        self.accelerators.saw(event)
        if self.metrics is not None:
            self.metrics.detected.labels(str(event.source)).inc()
        spooled = self._spool(self.dedup.offer(event))
        if marked is not None:
            marks, mark = marked
            if spooled:
                marks.note(mark)
            else:  # its line must be read again after a restart
                marks.hold()
        if done is not None:
            done.set()

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._settle(item)
        self._spool(self.dedup.drain())
        self._save_marks()

    def _save_marks(self) -> None:
        self._marks_due = self.clock.now().mono + MARK_SAVE_S
        for marks in self._marks:
            try:
                marks.save()
            except OSError as e:  # the next burst tries again; a restart re-reads a little
                self.log(f"agent: cannot save the read mark {marks.path}: {e}")

    def _spool(self, events: list[HealthEvent]) -> bool:
        """Spool ``events``; False when one of them is not on disk (the spool is full or the
        disk failed: said, and detection goes on)."""
        if not events:
            return True
        ok = True
        for event in events:
            try:
                ok = self.spool.put(event) and ok
            except OSError as e:
                self.log(f"agent: cannot spool {event.id} ({event.fault}): {e}")
                ok = False
        self._wake.set()
        return ok

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
        cfg = self.config
        started = []
        if "kmsg" in cfg.sources:
            marks = self._mark_file("kmsg")
            follower = KmsgFollower(
                cfg.node,
                self.boot_id,
                self.clock,
                path=cfg.kmsg_file,
                buses=cfg.buses,
                from_start=cfg.kmsg_from != "end",
                resume=marks.load(self.boot_id) if cfg.kmsg_from == "auto" else None,
                log=self.log,
                agent_version=cfg.version,
            )

            def follow_kmsg() -> None:
                emit = functools.partial(self.emit_marked, marks)
                follower.run(emit, stop, cfg.kmsg_interval_s)

            started.append(self._start("kmsg", follow_kmsg))
        if "journald" in cfg.sources:
            jmarks = self._mark_file("journald")
            journal = JournaldSource(
                cfg.node,
                self.boot_id,
                self.clock,
                buses=cfg.buses,
                command=cfg.journalctl,
                from_start=cfg.kmsg_from != "end",
                resume=jmarks.load(self.boot_id) if cfg.kmsg_from == "auto" else None,
                log=self.log,
                agent_version=cfg.version,
            )
            emit_j = functools.partial(self.emit_marked, jmarks)
            started.append(self._start("journald", lambda: journal.run(emit_j, stop)))
        if "nvml" in cfg.sources:
            started.append(self._start("nvml", lambda: self._run_nvml(stop)))
        if "tpu" in cfg.sources:
            started.append(self._start("tpu", lambda: self._run_tpu(stop)))
        if "progress" in cfg.sources:
            from agents.progress import ProgressSource

            watcher = self._progress = ProgressSource(
                cfg.node, self.clock, cfg.progress_registry, log=self.log,
                agent_version=cfg.version,
            )  # fmt: skip
            started.append(
                self._start(
                    "progress", lambda: watcher.run(self.emit, stop, cfg.progress_interval_s)
                )
            )
        if "inject" in cfg.sources:
            self._start("commands", lambda: self._commands(service_stop))
        return started

    def _mark_file(self, source: str) -> MarkFile:
        marks = MarkFile(self.config.spool_dir / MARK_FILES[source], log=self.log)
        self._marks.append(marks)
        return marks

    def _run_nvml(self, stop: threading.Event) -> None:
        from agents.nvml import NvmlSource, load_pynvml  # pynvml only where it is used

        module = (self._nvml or load_pynvml)(self.log)
        if module is None:
            return
        cfg = self.config
        NvmlSource(
            cfg.node, self.boot_id, self.clock, module, log=self.log, agent_version=cfg.version,
            summary=self.accelerators,
        ).run(self.emit, stop)  # fmt: skip

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
            log=self.log, agent_version=cfg.version, summary=self.accelerators,
        ).run(self.emit, stop)  # fmt: skip

    def _heartbeats(self, stop: threading.Event) -> None:
        said = False
        while not stop.is_set():
            try:
                said_now = {"spooled": len(self.spool), "accelerators": self.accelerators.to_json()}
                answer = self.link.heartbeat(self.config.version, said_now)
                self.beat_at = time.monotonic()
                said = False
                if self._progress is not None and isinstance(answer.get("progress"), dict):
                    self._progress.use_site_budgets(answer["progress"])
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
