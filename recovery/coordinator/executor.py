"""The executor: applies planned actions through the Slurm port and records each outcome.

Actions of one incident run in the order they were planned. An action that must wait
(checkpoint-then-requeue waiting for the jobs to save and leave, a promotion whose spare is
gone or that has none) is left ``waiting`` and does not hold up the actions after it; the
engine's reconcile tick (:mod:`recovery.coordinator.reconcile`) finishes it later, for a
promotion once the policy chose a spare again.

Restart safety: every action is idempotent through the port (a take-down of a node already
down with our reason changes nothing and runs no ``scontrol update``), and the two actions
whose effect cannot be read back from Slurm alone record what they are about to do *before*
doing it: the spare being promoted (``IncidentInfo.spare``), and the jobs signalled for a save
(``IncidentInfo.save``). A coordinator killed in between finds that note and does not promote
a second spare or signal twice. The spare a decision chose is not such a note: another
incident may have taken it since, so it is promoted only while it is still a ready spare.

Transient errors (slurmctld unreachable) are retried with backoff (:func:`recovery.retry.retry`);
an action still failing stays ``planned`` and is tried again on the next tick, until
``max_attempts``. A refusal is a verdict: the action is ``failed`` with Slurm's words.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from recovery.contract.jobmark import left_to_supervisor
from recovery.coordinator.kube import KubeFollow
from recovery.coordinator.validation import Validator
from recovery.errors import RecoverError, TransientError
from recovery.model import (
    Action,
    Drain,
    PromoteSpare,
    RequeueJobs,
    ReturnToPool,
    SaveThenRequeue,
    TakeDown,
)
from recovery.pool.spares import SparePool, is_ready_spare
from recovery.ports.clock import Clock
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    Journal,
    Phase,
    PhaseName,
    SaveNote,
)
from recovery.ports.slurm import NodeInfo, SlurmControl
from recovery.retry import Backoff, retry


@dataclass(frozen=True)
class ExecutorSettings:
    """How hard the executor tries.

    ``backoff`` governs retries of transient errors within one tick; ``max_attempts`` is how
    many ticks an action may fail transiently before it is recorded ``failed``.
    """

    backoff: Backoff = field(
        default_factory=lambda: Backoff(attempts=3, initial_s=0.2, factor=2.0, max_s=1.0)
    )
    max_attempts: int = 20
    dry_run: bool = False


@dataclass(frozen=True)
class Applied:
    """What one :meth:`Executor.run_pending` did: how many actions changed status, and
    whether it stopped at the deadline with single actions left to apply."""

    changed: int = 0
    cut_short: bool = False


class _Budget:
    """How long single actions go on in one :meth:`Executor.run_pending`."""

    def __init__(
        self, clock: Clock, slice_s: float | None, give_way: Callable[[], bool] | None
    ) -> None:
        self._clock, self._slice_s, self._give_way = clock, slice_s, give_way
        self._ends: float | None = None

    def spent(self) -> bool:
        """Whether the next single action must wait for the next call; never the first.
        The slice is timed from the first single action, not from the call: a large batched
        take-down before it must not use it up (it did, timed from the engine's step: after a
        150-node storm on a real slurmctld, one promotion per step, 8 spares in 15-28 s)."""
        now = self._clock.now().mono
        if self._ends is None:
            self._ends = math.inf if self._slice_s is None else now + self._slice_s
            return False
        return now > self._ends or (self._give_way is not None and self._give_way())


class Executor:
    """Applies actions for the engine; called from the engine's worker thread only."""

    def __init__(
        self,
        *,
        journal: Journal,
        slurm: SlurmControl,
        clock: Clock,
        settings: ExecutorSettings = ExecutorSettings(),  # frozen, one shared default is safe
        sleep: Callable[[float], None] | None = None,
        log: Callable[[str], None] = lambda _msg: None,
        kube: KubeFollow | None = None,
        validator: Validator | None = None,
    ) -> None:
        """``validator``: asked before a spare is promoted (policy ``validation``); None: no
        node is checked."""
        self._journal = journal
        self._validator = validator
        self._kube = kube
        """Kubernetes, when configured: take-outs through the slurm-operator (Slinky), and a
        repaired node's marks cleared as it returns to the pool."""
        self._slurm = slurm
        self._clock = clock
        self._settings = settings
        self._sleep = sleep
        self._log = log
        self._pool = SparePool(slurm)
        self._spares: list[NodeInfo] | None = None
        """The ready spares, read once per round of promotions (None: not read yet)."""

    # --- driving ------------------------------------------------------------------------

    def run_pending(
        self, slice_s: float | None = None, give_way: Callable[[], bool] | None = None
    ) -> Applied:
        """Apply every planned action whose predecessors in its incident are done or waiting.
        Take-downs and drains with the same reason go out as one Slurm call, and always run.
        Single actions (promotions, requeues, saves) are left for the next call once
        ``give_way()`` holds (the engine: events or commands arrived, to be decided first) or
        ``slice_s`` seconds after the first of them began (None: no limit); the first always
        runs, so that a steady stream of events cannot starve them."""
        changed = 0
        budget = _Budget(self._clock, slice_s, give_way)
        while True:
            ready = self._ready(self._journal.pending_actions())
            self._spares = None
            if not ready:
                return Applied(changed)
            progressed, cut_short = self._apply_round(ready, budget)
            changed += progressed
            if cut_short or not progressed:
                return Applied(changed, cut_short)

    @staticmethod
    def _ready(pending: Sequence[ActionRecord]) -> list[ActionRecord]:
        # One action per incident per round: the first that is still planned, provided
        # nothing before it is planned (a waiting action does not block the next).
        firsts: dict[str, ActionRecord] = {}
        for rec in pending:
            if rec.status == ActionStatus.planned and rec.incident not in firsts:
                firsts[rec.incident] = rec
        return list(firsts.values())

    def _apply_round(self, ready: Sequence[ActionRecord], budget: _Budget) -> tuple[int, bool]:
        """Apply one round; returns how many changed status and whether the single actions
        were cut short (see :meth:`run_pending`)."""
        if self._settings.dry_run:
            for rec in ready:
                self._finish(rec, ActionStatus.skipped, "dry run: decided, not applied")
            return len(ready), False
        batches: dict[tuple[str, str], list[ActionRecord]] = defaultdict(list)
        singles: list[ActionRecord] = []
        for rec in ready:
            a = rec.action
            if isinstance(a, TakeDown | Drain):
                batches[(a.kind, a.reason)].append(rec)
            else:
                singles.append(rec)
        progressed = 0
        for (kind, reason), recs in batches.items():
            progressed += self._take_out(kind, reason, recs)
        for rec in singles:
            if budget.spent():
                return progressed, True
            progressed += self._apply_one(rec)
        return progressed, False

    # --- outcomes -----------------------------------------------------------------------

    def _finish(self, rec: ActionRecord, status: ActionStatus, detail: str) -> None:
        self._journal.record_outcome(
            rec.id, status, self._clock.now(), detail=detail, attempts=rec.attempts + 1
        )

    def _phase(self, incident: str, name: PhaseName, detail: str = "") -> None:
        self._journal.add_phase(incident, Phase(name, self._clock.now(), detail))

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._sleep is None:
            return retry(fn, self._settings.backoff)
        return retry(fn, self._settings.backoff, sleep=self._sleep)

    def _failed_transiently(self, rec: ActionRecord, error: TransientError) -> int:
        attempts = rec.attempts + 1
        if attempts >= self._settings.max_attempts:
            self._finish(rec, ActionStatus.failed, f"gave up after {attempts} attempts: {error}")
            return 1
        # Still planned: the next tick tries again. Recording the attempt keeps the count.
        self._journal.record_outcome(
            rec.id, ActionStatus.planned, self._clock.now(), detail=str(error), attempts=attempts
        )
        self._log(f"{rec.action.kind} {rec.action.node}: {error}; will retry")
        return 0

    # --- take-downs and drains, batched ---------------------------------------------------

    def _take_out(self, kind: str, reason: str, recs: Sequence[ActionRecord]) -> int:
        if self._kube is not None and self._kube.mode.via_operator:
            return sum(self._apply_one(r) for r in recs)  # one pod annotation per node
        nodes = sorted({r.action.node for r in recs})
        many = self._slurm.down_many if kind == TakeDown.kind else self._slurm.drain_many
        try:
            changed = set(self._call(lambda: many(nodes, reason)))
        except TransientError as e:
            return sum(self._failed_transiently(r, e) for r in recs)
        except RecoverError as e:
            if len(recs) == 1:
                self._finish(recs[0], ActionStatus.failed, str(e))
                return 1
            # One refused node must not sink the others: apply them one by one.
            return sum(self._apply_one(r) for r in recs)
        phase = PhaseName.node_down if kind == TakeDown.kind else PhaseName.node_drained
        # One commit for all outcomes: Slurm already acted, and a restart before the commit
        # only applies the take-downs again, which changes nothing.
        with self._journal.batch():
            for r in recs:
                node = r.action.node
                note = "" if node in changed else "already held"
                self._finish(r, ActionStatus.done, note or "changed")
                self._phase(r.incident, phase, f"{node} {note}".strip())
        return len(recs)

    # --- everything else, one at a time -------------------------------------------------

    def _apply_one(self, rec: ActionRecord) -> int:
        handlers: dict[type[Action], Callable[[ActionRecord], tuple[ActionStatus, str]]] = {
            TakeDown: self._take_out_one,
            Drain: self._take_out_one,
            SaveThenRequeue: self._signal_for_save,
            RequeueJobs: self._requeue_all,
            PromoteSpare: self._promote,
            ReturnToPool: self._retire,
        }
        try:
            status, detail = self._call(lambda: handlers[type(rec.action)](rec))
        except TransientError as e:
            return self._failed_transiently(rec, e)
        except RecoverError as e:
            self._finish(rec, ActionStatus.failed, str(e))
            return 1
        if status == rec.status and status in (ActionStatus.planned, ActionStatus.waiting):
            return 0  # no news: nothing to record
        self._finish(rec, status, detail)
        return 1

    def _take_out_one(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        # One node alone: what a refused batch falls back to.
        a = rec.action
        assert isinstance(a, TakeDown | Drain)
        if self._kube is not None and self._kube.mode.via_operator:
            return self._kube.operator_take_out(rec)
        down = isinstance(a, TakeDown)
        changed = (self._slurm.down if down else self._slurm.drain)(a.node, a.reason)
        phase = PhaseName.node_down if down else PhaseName.node_drained
        self._phase(rec.incident, phase, a.node if changed else f"{a.node} already held")
        return ActionStatus.done, "changed" if changed else "already held"

    def _signal_for_save(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        a = rec.action
        assert isinstance(a, SaveThenRequeue)
        save = self._journal.incident(rec.incident).info.get("save")
        if save is None:
            jobs = [j.job_id for j in self._slurm.jobs_on(a.node)]
            now = self._clock.now()
            save = SaveNote(
                jobs=jobs, signalled_mono=now.mono, deadline_mono=now.mono + a.timeout_s
            )
            # Noted before signalling: a restarted coordinator must not signal twice.
            self._journal.update_incident(rec.incident, info={"save": save})
            for job in jobs:
                self._slurm.signal_job(job, "USR1")
            jobs_text = " ".join(jobs) or "no jobs on the node"
            self._phase(rec.incident, PhaseName.jobs_signalled, jobs_text)
        if not save["jobs"]:
            return ActionStatus.done, "no jobs to save"
        return ActionStatus.waiting, f"USR1 sent to {' '.join(save['jobs'])}; waiting for the save"

    def finish_save(self, rec: ActionRecord) -> bool:
        """For a waiting checkpoint-then-requeue: done once its jobs left the node; at the
        deadline requeue what is still there. Returns True when the action completed."""
        a = rec.action
        assert isinstance(a, SaveThenRequeue)
        save = self._journal.incident(rec.incident).info.get("save")
        jobs = set(save["jobs"]) if save else set()
        try:
            on_node = self._call(lambda: self._slurm.jobs_on(a.node))
            still = [j for j in on_node if j.job_id in jobs]
            if not still:
                # A job can also leave by dying before its save (its process killed by the
                # fault): it is ended, not requeued, and the ended-jobs step requeues it.
                died = sorted(
                    j.job_id
                    for j in self._call(self._slurm.jobs)
                    if j.job_id in jobs and j.finished
                )
                how = f"; ended without a save: {' '.join(died)}" if died else ""
                self._phase(rec.incident, PhaseName.jobs_saved, f"the jobs left the node{how}")
                self._finish(rec, ActionStatus.done, f"jobs left the node{how}")
                return True
            if save and self._clock.now().mono < save["deadline_mono"]:
                return False
            for j in still:
                self._call(functools.partial(self._slurm.requeue, j.job_id))
        except TransientError as e:
            self._log(f"save-requeue {a.node}: {e}; will retry")
            return False
        except RecoverError as e:
            self._finish(rec, ActionStatus.failed, str(e))
            return True
        ids = " ".join(j.job_id for j in still)
        self._phase(rec.incident, PhaseName.save_timeout, f"requeued {ids} without a save")
        self._finish(rec, ActionStatus.done, f"deadline passed; requeued {ids}")
        return True

    def _requeue_all(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        node = rec.action.node
        jobs = self._slurm.jobs_on(node)
        fault = self._journal.incident(rec.incident).fault
        # A job that recovers inside its allocation relaunches a hung launch itself (its
        # supervisor reads the same progress records): requeueing it would end that.
        own = [j.job_id for j in jobs if left_to_supervisor(j.comment, fault)]
        if own:
            self._journal.update_incident(rec.incident, info={"supervised": own})
            self._phase(
                rec.incident, PhaseName.left_to_job,
                f"{' '.join(own)}: its supervisor relaunches it inside its allocation",
            )  # fmt: skip
        done = [j.job_id for j in jobs if j.job_id not in own and self._slurm.requeue(j.job_id)]
        if done or not own:
            self._phase(
                rec.incident, PhaseName.jobs_requeued, " ".join(done) or "no jobs to requeue"
            )
        said = [
            f"requeued {' '.join(done)}" if done else "",
            f"left {' '.join(own)} to its supervisor" if own else "",
        ]
        return ActionStatus.done, "; ".join(w for w in said if w) or "no jobs to requeue"

    def _promote(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        a = rec.action
        assert isinstance(a, PromoteSpare)
        info = self._journal.incident(rec.incident).info
        noted = info.get("spare")
        if noted is not None:
            return self._promote_noted(rec, noted)
        chosen = info.get("spare_rechosen", a.spare)
        pool = self._pool_now()
        pick = next((n for n in pool if n.name == chosen), None)
        if pick is None:
            if not pool:
                self._phase(rec.incident, PhaseName.no_spare, "the spare pool is empty")
                return ActionStatus.waiting, "no ready spare in the pool; waiting for one"
            gone = "no spare was chosen" if chosen is None else f"{chosen} is not a ready spare"
            return ActionStatus.waiting, f"{gone}; waiting for the policy to choose again"
        if self._validator is not None:
            wait, asked = self._validator.gate(pick.name, rec.incident)
            if wait is not None:
                if asked:
                    self._phase(rec.incident, PhaseName.spare_checking, wait)
                return ActionStatus.waiting, wait
        pool.remove(pick)
        # Noted before promoting: a restarted coordinator finds this spare and finishes its
        # promotion rather than taking a second one.
        self._journal.update_incident(rec.incident, info={"spare": pick.name})
        return self._resume_spare(rec, pick.name)

    def _resume_spare(self, rec: ActionRecord, name: str) -> tuple[ActionStatus, str]:
        # Claimed while it is resumed: a burn-in does not start on it under the promotion.
        holder = self._validator.claims.claim(name, "promotion") if self._validator else None
        if holder is not None:
            return ActionStatus.waiting, f"{name} is busy ({holder}); promoting it after"
        try:
            self._slurm.resume(name)
        finally:
            if self._validator is not None:
                self._validator.claims.release(name)
        self._phase(rec.incident, PhaseName.spare_promoted, name)
        return ActionStatus.done, f"promoted {name}"

    def _promote_noted(self, rec: ActionRecord, noted: str) -> tuple[ActionStatus, str]:
        # A spare noted earlier (before a restart, or on a tick that failed): promoted
        # already, still ready, or gone (stopped answering, taken by someone): then the
        # policy chooses again.
        node = self._slurm.node(noted)
        if node.in_service:
            self._phase(rec.incident, PhaseName.spare_promoted, noted)
            return ActionStatus.done, f"promoted {noted}"
        if not is_ready_spare(node):
            self._journal.update_incident(rec.incident, info={"spare": None})
            return ActionStatus.waiting, (
                f"{noted} is no longer a ready spare; waiting for the policy to choose again"
            )
        return self._resume_spare(rec, noted)

    def _pool_now(self) -> list[NodeInfo]:
        if self._spares is None:  # one read of the pool per round of promotions
            self._spares = [n for n in self._slurm.nodes() if is_ready_spare(n)]
        return self._spares

    def forget_spare(self, name: str) -> None:
        """``name`` left the pool (held out after a failed check): not chosen from this
        round's read of the pool again."""
        if self._spares is not None:
            self._spares = [n for n in self._spares if n.name != name]

    def ready_spares(self) -> list[NodeInfo]:
        """The spares ready to be promoted now: the pool as read for this round of
        promotions, less the spares promoted since (a copy)."""
        return list(self._pool_now())

    def retry_promotion(self, rec: ActionRecord) -> bool:
        """A waiting promotion tries again, once the policy chose a spare again
        (``IncidentInfo.spare_rechosen``). Returns True when its status changed."""
        return self._apply_one(rec) == 1

    def _retire(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        changed = self._pool.retire(rec.action.node)
        self._phase(rec.incident, PhaseName.returned_to_pool, rec.action.node)
        if self._kube is not None:  # a transient error here leaves the action planned: retried
            self._kube.return_to_pool(rec)
        return ActionStatus.done, "retired into the pool" if changed else "already a spare"
