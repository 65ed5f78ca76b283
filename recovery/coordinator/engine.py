"""The engine: one worker thread that decides on journaled events and drives the executor.

Everything that touches Slurm or the policy state happens on the worker thread, in order:
events the intake committed (it only wakes the worker), operator commands (queued with a
future the caller waits on), and a reconcile tick every ``tick_s`` seconds. The journal is the
only memory: :meth:`Engine.recover` rebuilds the policy state from the decided history, decides
what was acknowledged but not decided, and finishes the actions that were planned - so the
coordinator can be SIGKILLed at any point and restarted.
"""

from __future__ import annotations

import json
import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from recovery.coordinator.executor import Executor, ExecutorSettings
from recovery.coordinator.kube import KubeFollow, KubeMode, finished
from recovery.coordinator.reconcile import follow_jobs, settled, unreachable_events
from recovery.coordinator.rules import Rules
from recovery.coordinator.views import (
    LAYOUT_KEY,
    breaker_view,
    layout_json,
    node_rows,
    status_view,
)
from recovery.errors import RecoverError, TransientError, UsageError, unknown_choice
from recovery.model import (
    Decision,
    Drain,
    HealthEvent,
    PromoteSpare,
    RequeueJobs,
    SaveThenRequeue,
    Source,
    TakeDown,
)
from recovery.model.events import HEARTBEAT_LOST, REPAIRED
from recovery.ports.checks import RepairChecker
from recovery.ports.clock import Clock, Stamp
from recovery.ports.journal import ActionStatus, Journal, Phase, StoredEvent
from recovery.ports.nodes import KubeNode, NodeControl
from recovery.ports.slurm import JobInfo, NodeInfo, SlurmControl
from recovery.spares import is_ready_spare

T = TypeVar("T")
#: Journal meta key: the wall times of every breaker reset, oldest first (JSON list).
RESETS_KEY = "breaker_resets"


class Heartbeats(Protocol):
    """Where the engine learns which agents went silent (the service's heartbeat tracker)."""

    def silent(self, now: float, after_s: float) -> list[str]:
        """Nodes whose agent beat once but not within ``after_s`` s before ``now`` (mono)."""
        ...


@dataclass(frozen=True)
class EngineSettings:
    """``tick_s``: seconds between reconcile ticks (Slurm is polled once a tick);
    ``command_timeout_s``: how long an operator command waits for the worker;
    ``suspect_after_s``: an agent silent this long makes its node a suspect."""

    tick_s: float = 0.5
    command_timeout_s: float = 30.0
    suspect_after_s: float = 20.0
    apply_slice_s: float = 0.2
    """Seconds of single actions per step before new events are decided again."""
    decide_batch: int = 100
    """Decisions committed together (one fsync); Slurm is acted on only after the commit."""
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    kube: KubeMode = field(default_factory=KubeMode)
    """How Kubernetes is kept in step (only used with a NodeControl)."""


def job_path(decision: Decision) -> str:
    """How the incident treats the node's jobs, for the record: saved first (the node still
    works), down at once (the GPU is gone: nothing could save), requeued in place, or none."""
    kinds = {a.kind for a in decision.actions}
    if SaveThenRequeue.kind in kinds:
        return "save-then-requeue"
    if TakeDown.kind in kinds:
        return "down-requeue (no save: the node cannot run the job)"
    if RequeueJobs.kind in kinds:
        return "requeue (node kept)"
    return "none"


class Engine:
    """Implements :class:`recovery.coordinator.api.CoordinatorApi` for the HTTP service."""

    def __init__(
        self,
        *,
        journal: Journal,
        slurm: SlurmControl,
        clock: Clock,
        rules: Rules,
        settings: EngineSettings = EngineSettings(),  # frozen, one shared default is safe
        log: Callable[[str], None] = lambda _msg: None,
        sleep: Callable[[float], None] | None = None,
        heartbeats: Heartbeats | None = None,
        checker: RepairChecker | None = None,
        nodes: NodeControl | None = None,
    ) -> None:
        self.journal = journal
        self.kube = (
            None
            if nodes is None
            else KubeFollow(journal=journal, nodes=nodes, clock=clock, mode=settings.kube, log=log)
        )
        self._kube_view: dict[str, KubeNode] = {}
        self.checker = checker
        self._checked: dict[str, float] = {}
        self.heartbeats = heartbeats
        self._suspects: frozenset[str] = frozenset()
        self.slurm = slurm
        self.clock = clock
        self.rules = rules
        self.settings = settings
        self.log = log
        self.executor = Executor(
            journal=journal,
            slurm=slurm,
            clock=clock,
            choose_spare=rules.choose_spare,
            settings=settings.executor,
            sleep=sleep,
            log=log,
            kube=self.kube,
        )
        self._wake = threading.Event()
        self._commands: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._view: tuple[NodeInfo, ...] = ()
        self._jobs: tuple[JobInfo, ...] = ()
        self._jobs_by_node: dict[str, list[JobInfo]] = {}
        self._view_at: Stamp | None = None
        self._layout: str | None = None
        self._lock = threading.Lock()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Recover from the journal, then run the worker thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="recover-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to stop after its current step and wait for it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        recovered = False
        while not self._stop.is_set():
            # Cleared before the step: a wake-up during the step starts the next one at once.
            self._wake.clear()
            try:
                if not recovered:
                    self.recover()
                    recovered = True
                self.step()
            except TransientError as e:
                self.log(f"engine: {e}; retrying next tick")
            except Exception:  # the worker must survive any one bad step; it is logged
                self.log("engine: unexpected error:\n" + traceback.format_exc())
            self._wake.wait(self.settings.tick_s)

    def recover(self) -> None:
        """Rebuild the policy state from the decided history (what a restart does first):
        every recorded decision, and the breaker resets at their times."""
        resets = self._resets()
        for stored, decision in self.journal.history():
            while resets and resets[0] <= stored.received.wall:
                self.rules.breaker_reset(resets.pop(0))
            if decision is not None:
                self.rules.record(stored.event, decision, stored.received.wall)
        for at in resets:
            self.rules.breaker_reset(at)

    def _resets(self) -> list[float]:
        return [float(t) for t in json.loads(self.journal.get_meta(RESETS_KEY) or "[]")]

    def step(self) -> None:
        """One turn of the worker: commands, new events, actions, reconcile."""
        self._run_commands()
        self._refresh()
        self.decide_pending()
        # Single actions (promotions, requeues) yield after a while to the next step, which
        # decides what arrived meanwhile first: a storm's decisions never wait behind them.
        self.executor.deadline = self.clock.now().mono + self.settings.apply_slice_s
        try:
            self.executor.run_pending()
        finally:
            self.executor.deadline = None
        if self.executor.cut_short:
            self._wake.set()  # more to apply: straight into the next step
            return
        self.reconcile()

    # --- CoordinatorApi -----------------------------------------------------------------

    def submit(self, events: Sequence[HealthEvent]) -> None:
        """Wake the worker: new events are in the journal."""
        if events:
            self._wake.set()

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            view, at, suspects, kube = self._view, self._view_at, self._suspects, self._kube_view
        return node_rows(view, self.journal.incidents(open_only=True), at, suspects, kube)

    def status(self) -> dict[str, Any]:
        with self._lock:
            view, at, suspects, kube = self._view, self._view_at, self._suspects, self._kube_view
        return status_view(
            view,
            self.journal.incidents(open_only=True),
            self.breaker(),
            at,
            suspects,
            dry_run=self.settings.executor.dry_run,
            kube=kube,
        )

    def node_names(self) -> set[str]:
        """The Slurm nodes as last seen (what Kubernetes events may name)."""
        with self._lock:
            return {n.name for n in self._view}

    def breaker(self) -> dict[str, Any]:
        with self._lock:
            view = self._view
        return breaker_view(
            self.rules.breaker_status(view, self.clock.now().wall), self.journal.held_actions()
        )

    def repaired(self, node: str) -> dict[str, Any]:
        return self._command(lambda: self._repaired(node))

    def breaker_reset(self) -> dict[str, Any]:
        return self._command(self._breaker_reset)

    def _command(self, fn: Callable[[], T]) -> T:
        if self._thread is None or not self._thread.is_alive():
            return fn()  # not started (tests, one-shot tools): run inline
        fut: Future[T] = Future()
        self._commands.put((fn, fut))
        self._wake.set()
        return fut.result(self.settings.command_timeout_s)

    def _run_commands(self) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the waiting caller
                fut.set_exception(e)

    # --- deciding -----------------------------------------------------------------------

    def _refresh(self) -> None:
        view = tuple(self.slurm.nodes())
        jobs = tuple(self.slurm.jobs())
        layout = layout_json(view)
        if layout != self._layout:
            # Kept so that `recover policy replay` can re-decide against the same cluster.
            self.journal.set_meta(LAYOUT_KEY, layout)
            self._layout = layout
        by_node: dict[str, list[JobInfo]] = {}
        for j in jobs:
            for n in j.nodes:
                by_node.setdefault(n, []).append(j)
        self._jobs_by_node = by_node
        now = self.clock.now()
        kube = self.kube.view(now.mono) if self.kube is not None else {}
        with self._lock:
            self._view, self._jobs, self._view_at, self._kube_view = view, jobs, now, kube

    def decide_pending(self) -> int:
        """Decide every acknowledged, undecided event in arrival order; returns how many."""
        pending = self.journal.undecided()
        n = self.settings.decide_batch
        for start in range(0, len(pending), n):
            with self.journal.batch():
                for stored in pending[start : start + n]:
                    self._decide(stored)
        return len(pending)

    def _decide(self, stored: StoredEvent) -> None:
        ev, received = stored.event, stored.received
        decision = self.rules.decide(ev, self._view, received.wall)
        self.journal.record_decision(decision, self.clock.now())
        self.rules.record(ev, decision, received.wall)
        if not (decision.opens and decision.incident):
            return
        inc = decision.incident
        lag = max(0.0, received.wall - ev.observed_at)
        self.journal.add_phase(inc, Phase("fault", Stamp(ev.observed_at, received.mono - lag)))
        self.journal.add_phase(inc, Phase("received", received))
        jobs = [j for j in self._jobs_by_node.get(ev.node, ()) if not j.finished]
        self.journal.update_incident(
            inc,
            jobs=[j.job_id for j in jobs],
            info={
                "job_restarts": {j.job_id: j.restart_count for j in jobs},
                "path": job_path(decision),
            },
        )
        if decision.held:
            self.journal.add_phase(inc, Phase("held", self.clock.now(), decision.why))

    # --- reconciling --------------------------------------------------------------------

    def reconcile(self) -> None:
        """Compare open incidents with Slurm's state and finish what is missing."""
        now = self.clock.now()
        open_incidents = self.journal.incidents(open_only=True)
        fresh = unreachable_events(self._view, {i.node for i in open_incidents}, now.wall)
        if fresh and any(self.journal.append_events(fresh, now)):
            self._wake.set()
        by_name = {n.name: n for n in self._view}
        for rec in self.journal.pending_actions():
            if rec.status != ActionStatus.waiting:
                continue
            if isinstance(rec.action, SaveThenRequeue):
                self.executor.finish_save(rec)
            elif isinstance(rec.action, PromoteSpare) and any(map(is_ready_spare, self._view)):
                self.executor.retry_promotion(rec)
            elif isinstance(rec.action, TakeDown | Drain) and self.kube is not None:
                self.kube.finish_operator_take_out(rec, by_name.get(rec.action.node), self.slurm)
        self._expire_held(now)
        self._watch_heartbeats(now)
        self._run_repair_checks(now)
        if self.kube is not None:
            seen = self._view_at.mono if self._view_at else None
            self.kube.reconcile(self.journal.incidents(open_only=True), by_name, seen)
        for inc in self.journal.incidents(open_only=True):
            progress = follow_jobs(inc, self._jobs)
            for name, detail in progress.phases:
                self.journal.add_phase(inc.id, Phase(name, now, detail))
            kube_done = self.kube is None or finished(inc, self.kube.mode)
            if progress.resolved and settled(inc) and kube_done:
                why = "jobs running again" if inc.jobs else "no job ran on the node"
                self.journal.close_incident(inc.id, now, f"actions done; {why}")

    def _watch_heartbeats(self, now: Stamp) -> None:
        """A node whose agent fell silent becomes a suspect: one ``heartbeat-lost`` event per
        silence, journaled and decided like any other (the policy says what it means)."""
        if self.heartbeats is None:
            return
        silent = frozenset(self.heartbeats.silent(now.mono, self.settings.suspect_after_s))
        fresh = [
            HealthEvent(
                id=f"heartbeat-lost-{node}-{int(now.wall)}",
                node=node,
                source=Source.heartbeat,
                fault=HEARTBEAT_LOST,
                observed_at=now.wall,
                message=f"no heartbeat from the agent for {self.settings.suspect_after_s:g} s",
            )
            for node in sorted(silent - self._suspects)
        ]
        with self._lock:
            self._suspects = silent
        if fresh:
            self.journal.append_events(fresh, now)
            self._wake.set()

    def _run_repair_checks(self, now: Stamp) -> None:
        """Every ``repair_check.interval_s`` seconds, check each node we hold out; one that
        passes goes back to the pool exactly as `recover node repaired` would send it."""
        check = self.rules.config.repair_check
        if check is None or self.checker is None:
            return
        for node in self.rules.out_nodes():
            if now.mono - self._checked.get(node, -1e18) < check.interval_s:
                continue
            self._checked[node] = now.mono
            if not self.checker.passes(node):
                continue
            try:
                self._repaired(node, "repair check passed")
            except UsageError as e:  # flapping, or someone else holds it now: it stays out
                self.log(f"repair check passed for {node}, but it stays out: {e}")

    def _expire_held(self, now: Stamp) -> list[int]:
        expired = []
        for rec in self.journal.held_actions():
            if rec.planned and now.wall - rec.planned.wall > self.rules.hold_max_age_s:
                age = now.wall - rec.planned.wall
                self.journal.record_outcome(
                    rec.id, ActionStatus.expired, now, detail=f"held {age:.0f} s; too old to replay"
                )
                expired.append(rec.id)
        return expired

    # --- operator commands (worker thread) ------------------------------------------------

    def _repaired(self, node: str, why: str = "operator: node repaired") -> dict[str, Any]:
        known = {n.name for n in self._view}
        if node not in known:
            raise unknown_choice("node", node, known)
        now = self.clock.now()
        event = HealthEvent(
            id=f"repaired-{node}-{int(now.wall * 1000)}",
            node=node,
            source=Source.operator,
            fault=REPAIRED,
            observed_at=now.wall,
            message=why,
        )
        refusal = self.rules.refuse_repair(node, self._view, now.wall)
        if refusal:
            raise UsageError(refusal)
        self.journal.append_events([event], now)
        self.decide_pending()
        self.executor.run_pending()
        return {"node": node, "event": event.id, "result": "returned to the spare pool"}

    def _breaker_reset(self) -> dict[str, Any]:
        now = self.clock.now()
        expired = self._expire_held(now)
        released = []
        for rec in self.journal.held_actions():
            self.journal.record_outcome(rec.id, ActionStatus.planned, now, detail="released")
            self.journal.add_phase(rec.incident, Phase("released", now, "breaker reset"))
            released.append(rec.id)
        self.rules.breaker_reset(now.wall)
        self.journal.set_meta(RESETS_KEY, json.dumps([*self._resets(), now.wall]))
        try:
            self.executor.run_pending()
        except RecoverError as e:
            self.log(f"breaker reset: actions will be retried: {e}")
        return {"released": released, "expired": expired}
