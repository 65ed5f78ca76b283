"""The engine: one worker thread that decides on journaled events and drives the executor.

Everything that touches Slurm or the policy state happens on the worker thread, in order:
events the intake committed (it only wakes the worker), operator commands (queued with a
future the caller waits on), and a reconcile tick every ``tick_s`` seconds. The journal is the
only memory: :meth:`Engine.recover` rebuilds the policy state from the decided history, decides
what was acknowledged but not decided, and finishes the actions that were planned - so the
coordinator can be SIGKILLed at any point and restarted.

An engine is built, with everything it works with, by
:func:`recovery.coordinator.build.build_engine`; nothing is handed to it afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from recovery.coordinator.executor import Executor, ExecutorSettings
from recovery.coordinator.jobwatch import JobWatch
from recovery.coordinator.kube import KubeFollow, KubeMode
from recovery.coordinator.leader import Deposed
from recovery.coordinator.reconcile import (
    Heartbeats,
    Reconciler,
    Snapshot,
    expire_held,
    spares_promised,
)
from recovery.coordinator.rules import Rules
from recovery.coordinator.validation import Validator
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
    HealthEvent,
    RequeueJobs,
    SaveThenRequeue,
    Source,
    TakeDown,
)
from recovery.model.events import HELD, REPAIRED, RETURNED
from recovery.ports.checks import RepairChecker
from recovery.ports.clock import Clock, Stamp
from recovery.ports.journal import ActionStatus, JobPath, Journal, Phase, PhaseName, StoredEvent
from recovery.ports.slurm import NodeInfo, SlurmControl

T = TypeVar("T")
#: Journal meta key: the wall times of every breaker reset, oldest first (JSON list).
RESETS_KEY = "breaker_resets"


@dataclass(frozen=True)
class EngineSettings:
    """``tick_s``: seconds between reconcile ticks (Slurm is polled once a tick);
    ``command_timeout_s``: how long an operator command waits for the worker;
    ``suspect_after_s``: an agent silent this long makes its node a suspect."""

    tick_s: float = 0.5
    command_timeout_s: float = 30.0
    suspect_after_s: float = 20.0
    apply_slice_s: float = 2.0
    """Seconds of single actions (promotions, requeues) per step at most, so that the
    reconcile tick still runs during a long run of them. Events or commands arriving cut them
    short at once: those are decided first (the first single action of a step always runs)."""
    decide_batch: int = 100
    """Decisions committed together (one fsync); Slurm is acted on only after the commit."""
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    kube: KubeMode = field(default_factory=KubeMode)
    """How Kubernetes is kept in step (only used with a NodeControl)."""


class Observer(Protocol):
    """What may watch the engine from outside without changing it (the benchmarks stamp
    each event with it). Called on the engine's threads: it must return quickly."""

    def submitted(self, events: Sequence[HealthEvent]) -> None:
        """The intake committed ``events`` (on the intake's thread, before the engine wakes)."""
        ...

    def decided(self, decisions: Sequence[Decision]) -> None:
        """``decisions`` were committed together (on the worker thread, before any of them
        is acted on)."""
        ...


class Unobserved:
    """The :class:`Observer` of an engine nobody watches."""

    def submitted(self, events: Sequence[HealthEvent]) -> None:
        pass

    def decided(self, decisions: Sequence[Decision]) -> None:
        pass


def job_path(decision: Decision) -> JobPath:
    """How the incident treats the node's jobs, for the record: saved first (the node still
    works), down at once (the GPU is gone: nothing could save), requeued in place, or none."""
    kinds = {a.kind for a in decision.actions}
    if SaveThenRequeue.kind in kinds:
        return JobPath.save_then_requeue
    if TakeDown.kind in kinds:
        return JobPath.down_requeue
    if RequeueJobs.kind in kinds:
        return JobPath.requeue
    return JobPath.none


class Engine:
    """Implements :class:`recovery.coordinator.api.CoordinatorApi` for the HTTP service.
    Build one with :func:`recovery.coordinator.build.build_engine`."""

    def __init__(
        self,
        *,
        journal: Journal,
        slurm: SlurmControl,
        clock: Clock,
        rules: Rules,
        executor: Executor,
        watch: JobWatch,
        settings: EngineSettings,
        log: Callable[[str], None],
        kube: KubeFollow | None,
        heartbeats: Heartbeats | None,
        checker: RepairChecker | None,
        observer: Observer,
        validator: Validator,
    ) -> None:
        self._journal = journal
        self._validator = validator
        self._slurm = slurm
        self._clock = clock
        self._rules = rules
        self._executor = executor
        self._watch = watch
        self._settings = settings
        self._log = log
        self._kube = kube
        self._observer = observer
        self._wake = threading.Event()
        self._reconciler = Reconciler(
            journal=journal,
            slurm=slurm,
            clock=clock,
            rules=rules,
            executor=executor,
            watch=watch,
            kube=kube,
            heartbeats=heartbeats,
            checker=checker,
            suspect_after_s=settings.suspect_after_s,
            log=log,
            wake=self._wake_up,
            repaired=self._repaired,
            validator=validator,
        )
        self._commands: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._checks: threading.Thread | None = None
        self._seen = Snapshot()
        """Slurm (and Kubernetes) as last read: replaced whole, read by the server's threads."""
        self._layout: str | None = None

    @property
    def executor(self) -> Executor:
        """The executor this engine drives (tests and tools run it by hand)."""
        return self._executor

    @property
    def validator(self) -> Validator:
        """Checks nodes before work lands on them (its thread runs beside the worker's)."""
        return self._validator

    def seen_nodes(self) -> tuple[NodeInfo, ...]:
        """The Slurm nodes as the worker last read them."""
        return self._seen.nodes

    @property
    def watch(self) -> JobWatch:
        """The watch over the jobs a fault ended (tests look at it)."""
        return self._watch

    @property
    def reconcile_steps(self) -> tuple[str, ...]:
        """The names of the reconcile tick's steps, in the order they run."""
        return tuple(name for name, _ in self._reconciler.steps)

    def _wake_up(self) -> None:
        self._wake.set()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Recover from the journal, then run the worker thread until :meth:`stop`; the
        validator's thread beside it."""
        self._thread = threading.Thread(target=self._run, name="recover-engine", daemon=True)
        self._thread.start()
        self._checks = threading.Thread(
            target=self._validator.run, args=(self._stop,), name="recover-checks", daemon=True
        )
        self._checks.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to stop after its current step and wait for it (a burn-in under
        way is left to finish: the next start puts its node back if it did not)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._checks is not None:
            self._checks.join(timeout_s)

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
            except Deposed as e:
                # The election deposed this replica between its rounds: it stops the engine.
                self._log(f"engine: {e}")
            except TransientError as e:
                self._log(f"engine: {e}; retrying next tick")
            except Exception:  # the worker must survive any one bad step; it is logged
                self._log("engine: unexpected error:\n" + traceback.format_exc())
            self._wake.wait(self._settings.tick_s)

    def recover(self) -> None:
        """Rebuild the policy state from the decided history (what a restart does first):
        every recorded decision, and the breaker resets at their times."""
        resets = self._resets()
        for stored, decision in self._journal.history():
            while resets and resets[0] <= stored.received.wall:
                self._rules.breaker_reset(resets.pop(0))
            if decision is not None:
                self._rules.record(stored.event, decision, stored.received.wall)
        for at in resets:
            self._rules.breaker_reset(at)
        self._rules.still_promised(spares_promised(self._journal.pending_actions()))
        self._watch.recover()

    def _resets(self) -> list[float]:
        return [float(t) for t in json.loads(self._journal.get_meta(RESETS_KEY) or "[]")]

    def step(self) -> None:
        """One turn of the worker: commands, new events, actions, reconcile."""
        # Whatever is committed from here on wakes the worker again (and makes the single
        # actions below give way); what was committed before, this step decides.
        self._wake.clear()
        self._run_commands()
        self._refresh()
        self.decide_pending()
        # Single actions (promotions, requeues) give way to the next step as soon as events
        # or commands arrive, so that those are decided first: a storm's decisions never wait
        # behind them. Without news they go on, for at most apply_slice_s.
        if self._executor.run_pending(self._settings.apply_slice_s, self._wake.is_set).cut_short:
            self._wake.set()  # more to apply: straight into the next step
            return
        self.reconcile()

    def reconcile(self) -> None:
        """The reconcile tick (:class:`recovery.coordinator.reconcile.Reconciler`): every
        step in order, against Slurm as this step read it."""
        self._reconciler.run(self._seen)

    # --- CoordinatorApi -----------------------------------------------------------------

    def submit(self, events: Sequence[HealthEvent]) -> None:
        """Wake the worker: new events are in the journal."""
        if events:
            self._observer.submitted(events)
            self._wake.set()

    def nodes(self) -> list[dict[str, Any]]:
        seen, suspects = self._seen, self._reconciler.suspects
        incidents = self._journal.incidents(open_only=True)
        return node_rows(seen.nodes, incidents, seen.at, suspects, seen.kube)

    def status(self) -> dict[str, Any]:
        seen, suspects = self._seen, self._reconciler.suspects
        view = status_view(
            seen.nodes,
            self._journal.incidents(open_only=True),
            self.breaker(),
            seen.at,
            suspects,
            dry_run=self._settings.executor.dry_run,
            kube=seen.kube,
        )
        rows = self._validator.rows(seen.nodes)
        view["checks"] = [r for r in rows if r["spare"] or r["verdict"] is not None]
        return view

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        """Check ``node`` now (on the caller's thread: a burn-in takes seconds), or record an
        operator's ``force``; the verdict, journaled. UsageError for an unknown node or one
        being checked or promoted now."""
        if force is not None:
            check = self._validator.force(node, force)
        else:
            check = self._validator.check(node, burn_in=burn_in)
        self._wake.set()  # the reconcile applies the verdict (holds a failed spare) at once
        return check.to_json()

    def look_at_node(self, node: str) -> dict[str, Any]:
        # The site's validation policy with it: a job supervisor checks its spares by it.
        policy = dataclasses.asdict(self._validator.settings)
        return {**self._validator.look(node).to_json(), "policy": policy}

    def node_names(self) -> set[str]:
        """The Slurm nodes as last seen (what Kubernetes events may name)."""
        return {n.name for n in self._seen.nodes}

    def breaker(self) -> dict[str, Any]:
        status = self._rules.breaker_status(self._seen.nodes, self._clock.now().wall)
        return breaker_view(status, self._journal.held_actions())

    def repaired(self, node: str) -> dict[str, Any]:
        v = self._validator
        known = node in {n.name for n in self._seen.nodes}
        if known:  # the faults seen before now are the ones repaired
            v.note_repaired(node, self._clock.now().wall)
        if v.settings.required and known:
            # Checked first, on this (the caller's) thread: only a node that passes goes back.
            last = v.last(node)
            if last is None or not v.fresh(node):
                # The incidents of the fault this repair answers do not count against it.
                mine = [i.id for i in self._journal.incidents(open_only=True) if i.node == node]
                last = v.check(node, excuse=mine)
            bad = last.failed
            if not last.passed:
                words = f"{bad.name}: {bad.detail}" if bad is not None else last.verdict
                raise UsageError(
                    f"{node} failed its check ({words}); it stays out. Fix it and try again, "
                    f"or vouch for it: recover node check {node} --force REASON"
                )
        return self._command(lambda: self._repaired(node))

    def breaker_reset(self) -> dict[str, Any]:
        return self._command(self._breaker_reset)

    def _command(self, fn: Callable[[], T]) -> T:
        if self._thread is None or not self._thread.is_alive():
            return fn()  # not started (tests, one-shot tools): run inline
        fut: Future[T] = Future()
        self._commands.put((fn, fut))
        self._wake.set()
        return fut.result(self._settings.command_timeout_s)

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
        # Stamped before the reads: the view shows everything done before this moment (what
        # `recover inject --wait` relies on to return only once `recover status` shows it).
        now = self._clock.now()
        nodes = tuple(self._slurm.nodes())
        jobs = tuple(self._slurm.jobs())
        layout = layout_json(nodes)
        if layout != self._layout:
            # Kept so that `recover policy replay` can re-decide against the same cluster.
            self._journal.set_meta(LAYOUT_KEY, layout)
            self._layout = layout
        self._watch.observe(jobs, now.wall)
        kube = self._kube.view(now.mono) if self._kube is not None else {}
        self._seen = Snapshot(nodes, jobs, now, kube)

    def decide_pending(self) -> int:
        """Decide every acknowledged, undecided event in arrival order; returns how many."""
        pending = self._journal.undecided()
        n = self._settings.decide_batch
        for start in range(0, len(pending), n):
            with self._journal.batch():
                decisions = [self._decide(stored) for stored in pending[start : start + n]]
            self._observer.decided(decisions)
        return len(pending)

    def _decide(self, stored: StoredEvent) -> Decision:
        """Decide, record and fold one event (a spare it promises is not chosen again)."""
        ev, received = stored.event, stored.received
        decision = self._rules.decide(ev, self._seen.nodes, received.wall)
        self._journal.record_decision(decision, self._clock.now())
        self._rules.record(ev, decision, received.wall)
        if ev.fault == RETURNED and decision.incident and not decision.opens:
            now = self._clock.now()
            self._journal.add_phase(
                decision.incident, Phase(PhaseName.back_in_service, now, ev.message)
            )
        if not (decision.opens and decision.incident):
            return decision
        inc = decision.incident
        lag = max(0.0, received.wall - ev.observed_at)
        observed = Stamp(ev.observed_at, received.mono - lag)
        self._journal.add_phase(inc, Phase(PhaseName.fault, observed))
        self._journal.add_phase(inc, Phase(PhaseName.received, received))
        if ev.fault == HELD:  # about one job, which the reconcile's held-jobs step names
            return decision
        # The jobs live on the node, and those the fault ended or Slurm requeued from it
        # just before (jobwatch), each at the restart count of its run there.
        fault_at = min(ev.observed_at, received.wall)
        listing = self._seen.jobs_by_node.get(ev.node, ())
        path = job_path(decision)
        restarts = self._watch.at_decision(
            ev.node, fault_at, listing, self._seen.jobs_by_id, self._clock.now().wall,
            moves_jobs=path is not JobPath.none,
        )  # fmt: skip
        self._journal.update_incident(
            inc, jobs=list(restarts), info={"job_restarts": restarts, "path": path}
        )
        if decision.held:
            self._journal.add_phase(inc, Phase(PhaseName.held, self._clock.now(), decision.why))
        return decision

    # --- operator commands (worker thread) ------------------------------------------------

    def _repaired(self, node: str, why: str = "operator: node repaired") -> dict[str, Any]:
        known = {n.name for n in self._seen.nodes}
        if node not in known:
            raise unknown_choice("node", node, known)
        now = self._clock.now()
        event = HealthEvent(
            id=f"repaired-{node}-{int(now.wall * 1000)}",
            node=node,
            source=Source.operator,
            fault=REPAIRED,
            observed_at=now.wall,
            message=why,
        )
        refusal = self._rules.refuse_repair(node, self._seen.nodes, now.wall)
        if refusal:
            raise UsageError(refusal)
        self._journal.append_events([event], now)
        self.decide_pending()
        self._executor.run_pending()
        return {"node": node, "event": event.id, "result": "returned to the spare pool"}

    def _breaker_reset(self) -> dict[str, Any]:
        now = self._clock.now()
        expired = expire_held(self._journal, self._rules.hold_max_age_s, now)
        released = []
        for rec in self._journal.held_actions():
            self._journal.record_outcome(rec.id, ActionStatus.planned, now, detail="released")
            self._journal.add_phase(rec.incident, Phase(PhaseName.released, now, "breaker reset"))
            released.append(rec.id)
        self._rules.breaker_reset(now.wall)
        self._journal.set_meta(RESETS_KEY, json.dumps([*self._resets(), now.wall]))
        try:
            self._executor.run_pending()
        except RecoverError as e:
            self._log(f"breaker reset: actions will be retried: {e}")
        return {"released": released, "expired": expired}
