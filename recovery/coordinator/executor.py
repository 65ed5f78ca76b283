"""The executor: applies planned actions through the Slurm port and records each outcome.

Actions of one incident run in the order they were planned. An action that must wait
(checkpoint-then-requeue waiting for the jobs to save and leave, a promotion with an empty
pool) is left ``waiting`` and does not hold up the actions after it; the reconcile tick
(:mod:`recovery.coordinator.reconcile`) finishes it later.

Restart safety: every action is idempotent through the port (a take-down of a node already
down with our reason changes nothing and runs no ``scontrol update``), and the two actions
whose effect cannot be read back from Slurm alone record what they are about to do *before*
doing it: the spare chosen for a promotion, and the jobs signalled for a save. A coordinator
killed in between finds that note and does not choose a second spare or signal twice.

Transient errors (slurmctld unreachable) are retried with backoff (:func:`recovery.retry.retry`);
an action still failing stays ``planned`` and is tried again on the next tick, until
``max_attempts``. A refusal is a verdict: the action is ``failed`` with Slurm's words.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from recovery.coordinator.kube import KubeFollow
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
from recovery.ports.clock import Clock
from recovery.ports.journal import ActionRecord, ActionStatus, Journal, Phase
from recovery.ports.slurm import NodeInfo, SlurmControl
from recovery.retry import Backoff, retry
from recovery.spares import SparePool, is_ready_spare

#: Jobs in these states still occupy their node.
ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"})

ChooseSpare = Callable[[Sequence[NodeInfo], str], NodeInfo | None]


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


class Executor:
    """Applies actions for the engine; called from the engine's worker thread only."""

    def __init__(
        self,
        *,
        journal: Journal,
        slurm: SlurmControl,
        clock: Clock,
        choose_spare: ChooseSpare,
        settings: ExecutorSettings = ExecutorSettings(),  # frozen, one shared default is safe
        sleep: Callable[[float], None] | None = None,
        log: Callable[[str], None] = lambda _msg: None,
        kube: KubeFollow | None = None,
    ) -> None:
        self.journal = journal
        self.kube = kube
        """Kubernetes, when configured: take-outs through the slurm-operator (Slinky), and a
        repaired node's marks cleared as it returns to the pool."""
        self.slurm = slurm
        self.clock = clock
        self.choose_spare = choose_spare
        self.settings = settings
        self._sleep = sleep
        self.log = log
        self.pool = SparePool(slurm)
        self.deadline: float | None = None
        """Monotonic time after which single actions wait for the next step (which decides
        new events first); None: no limit. Batched take-downs always run."""
        self.cut_short = False
        self._spares: list[NodeInfo] | None = None

    # --- driving ------------------------------------------------------------------------

    def run_pending(self) -> int:
        """Apply every planned action whose predecessors in its incident are done or waiting.
        Take-downs and drains with the same reason go out as one Slurm call. Returns how many
        actions changed status."""
        changed = 0
        self.cut_short = False
        while not self.cut_short:
            ready = self._ready(self.journal.pending_actions())
            self._spares = None
            if not ready:
                return changed
            progressed = self._apply_round(ready)
            changed += progressed
            if not progressed:
                return changed
        return changed

    @staticmethod
    def _ready(pending: Sequence[ActionRecord]) -> list[ActionRecord]:
        # One action per incident per round: the first that is still planned, provided
        # nothing before it is planned (a waiting action does not block the next).
        firsts: dict[str, ActionRecord] = {}
        for rec in pending:
            if rec.status == ActionStatus.planned and rec.incident not in firsts:
                firsts[rec.incident] = rec
        return list(firsts.values())

    def _apply_round(self, ready: Sequence[ActionRecord]) -> int:
        if self.settings.dry_run:
            for rec in ready:
                self._finish(rec, ActionStatus.skipped, "dry run: decided, not applied")
            return len(ready)
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
            if self.deadline is not None and self.clock.now().mono > self.deadline:
                self.cut_short = True
                break
            progressed += self._apply_one(rec)
        return progressed

    # --- outcomes -----------------------------------------------------------------------

    def _finish(self, rec: ActionRecord, status: ActionStatus, detail: str) -> None:
        self.journal.record_outcome(
            rec.id, status, self.clock.now(), detail=detail, attempts=rec.attempts + 1
        )

    def _phase(self, incident: str, name: str, detail: str = "") -> None:
        self.journal.add_phase(incident, Phase(name, self.clock.now(), detail))

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._sleep is None:
            return retry(fn, self.settings.backoff)
        return retry(fn, self.settings.backoff, sleep=self._sleep)

    def _failed_transiently(self, rec: ActionRecord, error: TransientError) -> int:
        attempts = rec.attempts + 1
        if attempts >= self.settings.max_attempts:
            self._finish(rec, ActionStatus.failed, f"gave up after {attempts} attempts: {error}")
            return 1
        # Still planned: the next tick tries again. Recording the attempt keeps the count.
        self.journal.record_outcome(
            rec.id, ActionStatus.planned, self.clock.now(), detail=str(error), attempts=attempts
        )
        self.log(f"{rec.action.kind} {rec.action.node}: {error}; will retry")
        return 0

    # --- take-downs and drains, batched ---------------------------------------------------

    def _take_out(self, kind: str, reason: str, recs: Sequence[ActionRecord]) -> int:
        if self.kube is not None and self.kube.mode.via_operator:
            return sum(self._apply_one(r) for r in recs)  # one pod annotation per node
        nodes = sorted({r.action.node for r in recs})
        many = self.slurm.down_many if kind == TakeDown.kind else self.slurm.drain_many
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
        phase = "node-down" if kind == TakeDown.kind else "node-drained"
        # One commit for all outcomes: Slurm already acted, and a restart before the commit
        # only applies the take-downs again, which changes nothing.
        with self.journal.batch():
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
        if self.kube is not None and self.kube.mode.via_operator:
            return self.kube.operator_take_out(rec)
        down = isinstance(a, TakeDown)
        changed = (self.slurm.down if down else self.slurm.drain)(a.node, a.reason)
        phase = "node-down" if down else "node-drained"
        self._phase(rec.incident, phase, a.node if changed else f"{a.node} already held")
        return ActionStatus.done, "changed" if changed else "already held"

    def _signal_for_save(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        a = rec.action
        assert isinstance(a, SaveThenRequeue)
        info = self.journal.incident(rec.incident).info
        save = info.get("save")
        if save is None:
            jobs = [j.job_id for j in self.slurm.jobs_on(a.node)]
            now = self.clock.now()
            save = {
                "jobs": jobs,
                "signalled_mono": now.mono,
                "deadline_mono": now.mono + a.timeout_s,
            }
            # Noted before signalling: a restarted coordinator must not signal twice.
            self.journal.update_incident(rec.incident, info={"save": save})
            for job in jobs:
                self.slurm.signal_job(job, "USR1")
            self._phase(rec.incident, "jobs-signalled", " ".join(jobs) or "no jobs on the node")
        if not save["jobs"]:
            return ActionStatus.done, "no jobs to save"
        return ActionStatus.waiting, f"USR1 sent to {' '.join(save['jobs'])}; waiting for the save"

    def finish_save(self, rec: ActionRecord) -> bool:
        """For a waiting checkpoint-then-requeue: done once its jobs left the node; at the
        deadline requeue what is still there. Returns True when the action completed."""
        a = rec.action
        assert isinstance(a, SaveThenRequeue)
        save = self.journal.incident(rec.incident).info.get("save") or {}
        jobs = set(save.get("jobs", []))
        try:
            still = [j for j in self._call(lambda: self.slurm.jobs_on(a.node)) if j.job_id in jobs]
            if not still:
                self._phase(rec.incident, "jobs-saved", "the jobs saved and left the node")
                self._finish(rec, ActionStatus.done, "jobs saved and left")
                return True
            if self.clock.now().mono < float(save.get("deadline_mono", 0.0)):
                return False
            for j in still:
                self._call(functools.partial(self.slurm.requeue, j.job_id))
        except TransientError as e:
            self.log(f"save-requeue {a.node}: {e}; will retry")
            return False
        except RecoverError as e:
            self._finish(rec, ActionStatus.failed, str(e))
            return True
        ids = " ".join(j.job_id for j in still)
        self._phase(rec.incident, "save-timeout", f"requeued {ids} without a save")
        self._finish(rec, ActionStatus.done, f"deadline passed; requeued {ids}")
        return True

    def _requeue_all(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        node = rec.action.node
        jobs = self.slurm.jobs_on(node)
        done = [j.job_id for j in jobs if self.slurm.requeue(j.job_id)]
        self._phase(rec.incident, "jobs-requeued", " ".join(done) or "no jobs to requeue")
        return ActionStatus.done, f"requeued {' '.join(done)}" if done else "no jobs to requeue"

    def _promote(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        chosen = self.journal.incident(rec.incident).info.get("spare")
        if chosen is not None:
            return self._promote_noted(rec, str(chosen))
        if self._spares is None:  # one read of the pool per round of promotions
            self._spares = [n for n in self.slurm.nodes() if is_ready_spare(n)]
        pick = self.choose_spare(self._spares, rec.action.node)
        if pick is None:
            self._phase(rec.incident, "no-spare", "the spare pool is empty")
            return ActionStatus.waiting, "no ready spare in the pool; waiting for one"
        self._spares.remove(pick)
        # Noted before promoting: a restarted coordinator finds this spare and finishes its
        # promotion rather than taking a second one.
        self.journal.update_incident(rec.incident, info={"spare": pick.name})
        self.slurm.resume(pick.name)
        self._phase(rec.incident, "spare-promoted", pick.name)
        return ActionStatus.done, f"promoted {pick.name}"

    def _promote_noted(self, rec: ActionRecord, chosen: str) -> tuple[ActionStatus, str]:
        # A spare chosen earlier (before a restart, or on a tick that failed): promoted
        # already, still ready, or gone (stopped answering, taken by someone): choose again.
        node = self.slurm.node(chosen)
        if node.in_service:
            self._phase(rec.incident, "spare-promoted", chosen)
            return ActionStatus.done, f"promoted {chosen}"
        if not is_ready_spare(node):
            self.journal.update_incident(rec.incident, info={"spare": None})
            return ActionStatus.planned, f"{chosen} is no longer a ready spare; choosing again"
        self.slurm.resume(chosen)
        self._phase(rec.incident, "spare-promoted", chosen)
        return ActionStatus.done, f"promoted {chosen}"

    def retry_promotion(self, rec: ActionRecord) -> bool:
        """A waiting promotion tries again (a spare may have been retired into the pool).
        Returns True when its status changed."""
        return self._apply_one(rec) == 1

    def _retire(self, rec: ActionRecord) -> tuple[ActionStatus, str]:
        changed = self.pool.retire(rec.action.node)
        self._phase(rec.incident, "returned-to-pool", rec.action.node)
        if self.kube is not None:  # a transient error here leaves the action planned: retried
            self.kube.return_to_pool(rec)
        return ActionStatus.done, "retired into the pool" if changed else "already a spare"
