"""The reconcile tick: Slurm as a source of truth, and everything that waits on time or on
the cluster, as an ordered list of named steps (:attr:`Reconciler.steps`).

* A node Slurm holds DOWN that no agent reported and that nobody marked (a crashed slurmd, a
  node that lost power) becomes a ``node-unreachable`` event - a failure no agent can report.
* Waiting actions progress: saves (the jobs left, or the deadline passed), promotions (the
  policy chooses a spare again), Slinky take-outs (the slurm-operator drained the node).
* A node we hold out that Slurm shows in service again without us (an operator resumed it, a
  cluster started anew on this journal) is let go by its incident (``node-returned``):
  Slurm's truth wins over the journal, and a new fault there is acted on.
* Held actions too old to replay expire; silent agents make their nodes suspects; nodes we
  hold out are repair-checked; Kubernetes is kept in step (:mod:`recovery.coordinator.kube`).
* Jobs of a node taken out that ended before Slurm could requeue them are requeued once, or
  the reason why not is recorded (:mod:`recovery.coordinator.jobwatch`).
* The jobs that ran on an incident's node are followed: requeued (``jobs-requeued``), running
  again (``job-running``, on which nodes), or finished; an incident whose actions are all
  settled and whose jobs run again (or ended) is closed.

A step that raises is logged by its name (a transient error in one line, anything else with
its traceback) and the steps after it still run. The module's functions are pure over
snapshots (nodes, jobs, incidents); the :class:`Reconciler` applies what they return.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from recovery.contract.exits import EXIT_DO_NOT_RESTART, EXIT_PEER_LOST, EXIT_PREEMPTED
from recovery.contract.jobmark import is_ours
from recovery.coordinator.executor import Executor
from recovery.coordinator.jobwatch import JobWatch
from recovery.coordinator.kube import KubeFollow, finished
from recovery.coordinator.leader import Deposed
from recovery.coordinator.rules import Rules
from recovery.coordinator.validation import Validator
from recovery.errors import TransientError, UsageError
from recovery.model import Drain, HealthEvent, PromoteSpare, SaveThenRequeue, Source, TakeDown
from recovery.model.events import HEARTBEAT_LOST, HELD, RETURNED, UNREACHABLE
from recovery.policy import incident_id
from recovery.policy.requeue import describe_end, lost_batch_host
from recovery.pool.spares import SPARE_REASON, is_spare
from recovery.pool.validate import CHECK_FAILED_PREFIX
from recovery.ports.checks import RepairChecker
from recovery.ports.clock import Clock, Stamp
from recovery.ports.journal import (
    ActionRecord,
    ActionStatus,
    IncidentRecord,
    IncidentStatus,
    JobPath,
    Journal,
    Phase,
    PhaseName,
    SpareCheckNote,
)
from recovery.ports.nodes import KubeNode
from recovery.ports.slurm import JobInfo, NodeInfo, SlurmControl, describe_state, is_slurms_own

#: Actions in these states still have work to do; an incident with any stays open.
UNSETTLED = frozenset({ActionStatus.planned, ActionStatus.waiting, ActionStatus.held})
#: Seconds a node the policy holds out must show in service, with no take-out of ours left to
#: run, before it counts as returned without us (a snapshot read just before our own take-out
#: landed shows it in service for one tick).
BACK_AFTER_S = 5.0
#: A job of ours that Slurm holds is explained (and released when its run asked to go on)
#: once it has been held this long with no node's fault claiming it: a fault's report may
#: come a few seconds after the job it ended.
HELD_GRACE_S = 30.0
#: The jobs ``recover sbatch`` submits (its default job name): with its mark in the comment
#: (:mod:`recovery.contract.jobmark`, whatever the name), the only held jobs explained and
#: released (another user's held job is theirs and Slurm's). The name alone still counts for
#: jobs submitted before the mark was.
OUR_JOB_NAME = "recover-train"


def ours(job: JobInfo) -> bool:
    """``job`` was submitted by ``recover sbatch``."""
    return is_ours(job.comment) or job.name == OUR_JOB_NAME


def judge_held(job: JobInfo, released: int, budget: int) -> tuple[bool, str]:
    """Whether to release ``job``, which Slurm holds after its run ended, and why (pure).
    ``released``: how many of its holds the coordinator released within the budget's window.

    Released: a run that saved and stopped on a signal (exit 75: a preemption, someone's
    SIGTERM) or that stopped because a peer was lost (exit 76: a process died, froze or hung
    and was stopped, with no node fault reported); both continue from their checkpoint.
    Left held, with the reason: a run that asked not to be restarted (exit 93), any other
    failure (the training's own: a bug, a missing program), and a job whose release budget
    is spent."""
    end = describe_end(job)
    code = job.exit_code
    if code == EXIT_DO_NOT_RESTART:
        return False, f"its run asked not to be restarted (exit {code})"
    if code not in (EXIT_PREEMPTED, EXIT_PEER_LOST):
        return False, (
            f"its run failed on its own ({end}): the training's error, not a node's; read "
            f"its output, then `scontrol release {job.job_id}` to run it again"
        )
    if released >= budget:
        return False, (
            f"released {released} time(s) already within the budget's window: it keeps "
            f"stopping ({end}); look at it before `scontrol release {job.job_id}`"
        )
    why = (
        "its run saved and stopped on a signal (exit 75: a preemption, or someone's SIGTERM)"
        if code == EXIT_PREEMPTED
        else "a process of its run lost a peer (exit 76) and no node's fault was reported"
    )
    return True, f"{why}; released to continue from its newest checkpoint"


def unreachable_events(
    nodes: Iterable[NodeInfo], open_nodes: set[str], now_wall: float
) -> list[HealthEvent]:
    """``node-unreachable`` events for nodes Slurm holds DOWN by its own doing (not ours, not
    another owner's) that have no open incident.

    The id is derived from the node and the time Slurm recorded its reason, so the same
    outage seen again (after a coordinator restart) is recognised as a duplicate.
    """
    events = []
    for n in nodes:
        # Only Slurm's own DOWN (a silent slurmd) is a failure to handle: ours is handled
        # already, and another owner's is their business.
        if n.name in open_nodes or not n.down or not is_slurms_own(n.reason):
            continue
        since = int(n.reason_changed_at) if n.reason_changed_at else int(now_wall)
        events.append(
            HealthEvent(
                id=f"slurm-{n.name}-down-{since}",
                node=n.name,
                source=Source.slurm,
                fault=UNREACHABLE,
                observed_at=float(since) if n.reason_changed_at else now_wall,
                message=f"Slurm reports {n.name} DOWN: {n.reason or 'no reason given'}",
            )
        )
    return events


@dataclass(frozen=True)
class JobProgress:
    """What to record about one incident's jobs: new phases, and whether they are resolved."""

    phases: tuple[tuple[PhaseName, str], ...]
    resolved: bool


def follow_jobs(
    incident: IncidentRecord,
    by_id: Mapping[str, JobInfo],
    awaiting: Set[str] = frozenset(),
) -> JobProgress:
    """Phases the incident's jobs reached, from one ``squeue`` snapshot (jobs by id).

    ``jobs-requeued`` once a job is pending again or its restart count rose; ``job-running``
    once every job that is still known runs again after a restart; ``in-allocation`` for a job
    that runs on without the node and was never requeued (a ``--no-kill`` job with spares of
    its own: Slurm dropped the node and the job recovers inside its allocation), or for one
    left to its own supervisor (``supervised`` in the incident's info: a hang the supervisor
    relaunches on the same nodes), which counts as resolved. Jobs Slurm forgot, that
    finished, or that Slurm holds (``REQUEUE_HOLD``) count as resolved, except those in
    ``awaiting``: ended jobs whose requeue the coordinator noted and Slurm has not confirmed
    yet (:meth:`JobWatch.awaiting`).
    """
    initial = incident.info.get("job_restarts", {})
    supervised = set(incident.info.get("supervised", ()))
    have = {p.name for p in incident.phases}
    phases: list[tuple[PhaseName, str]] = []
    requeued: list[str] = []
    running: list[str] = []
    in_allocation: list[str] = []
    unresolved = 0
    for job_id in incident.jobs:
        job = by_id.get(job_id)
        # Held by Slurm (REQUEUE_HOLD, 25.11's expedited requeue): ended until released.
        ended = job is not None and (job.finished or job.requeue_held)
        if job is None or (ended and job_id not in awaiting):
            continue
        restarted = job.restart_count > int(initial.get(job_id, 0))
        if (restarted or job.state == "PENDING") and not job.requeue_held:
            requeued.append(job_id)
        if restarted and job.state == "RUNNING":
            running.append(f"{job_id}@{','.join(job.nodes)}")
        elif job.state == "RUNNING" and (
            job_id in supervised
            or (
                not job.uses(incident.node)
                and not lost_batch_host(job, incident.node, job.restart_count)
            )
        ):
            in_allocation.append(f"{job_id}@{','.join(job.nodes)}")
        else:
            unresolved += 1
    if requeued and PhaseName.jobs_requeued not in have:
        phases.append((PhaseName.jobs_requeued, " ".join(requeued)))
    if in_allocation and PhaseName.in_allocation not in have:
        phases.append((PhaseName.in_allocation, " ".join(in_allocation)))
    if running and not unresolved and PhaseName.job_running not in have:
        phases.append((PhaseName.job_running, " ".join(running)))
    return JobProgress(tuple(phases), resolved=unresolved == 0)


def settled(incident: IncidentRecord) -> bool:
    """Every action of the incident reached an end state."""
    return all(a.status not in UNSETTLED for a in incident.actions)


def spares_promised(pending: Iterable[ActionRecord]) -> set[str]:
    """The spares named by promotions still ``planned``: chosen, not promoted yet. (A waiting
    promotion's spare was found gone: it promises nothing.)"""
    return {
        r.action.spare
        for r in pending
        if r.status == ActionStatus.planned
        and isinstance(r.action, PromoteSpare)
        and r.action.spare is not None
    }


def expire_held(journal: Journal, max_age_s: float, now: Stamp) -> list[int]:
    """Record every held action older than ``max_age_s`` as ``expired`` (never replayed
    blindly); returns their ids."""
    expired = []
    for rec in journal.held_actions():
        if rec.planned and now.wall - rec.planned.wall > max_age_s:
            age = now.wall - rec.planned.wall
            journal.record_outcome(
                rec.id, ActionStatus.expired, now, detail=f"held {age:.0f} s; too old to replay"
            )
            expired.append(rec.id)
    return expired


@dataclass(frozen=True)
class Snapshot:
    """Slurm (and Kubernetes) as the engine read them at the start of a step: what the
    step's decisions and its reconcile tick go by, and what ``recover status`` shows."""

    nodes: tuple[NodeInfo, ...] = ()
    jobs: tuple[JobInfo, ...] = ()
    at: Stamp | None = None
    """When Slurm was read; None before the first read."""
    kube: Mapping[str, KubeNode] = field(default_factory=dict)

    @cached_property
    def by_name(self) -> dict[str, NodeInfo]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def jobs_by_id(self) -> dict[str, JobInfo]:
        return {j.job_id: j for j in self.jobs}

    @cached_property
    def jobs_by_node(self) -> dict[str, list[JobInfo]]:
        """The jobs that list each node (running there, or ended after running there; a
        pending job lists none)."""
        out: dict[str, list[JobInfo]] = {}
        for j in self.jobs:
            for n in j.nodes:
                out.setdefault(n, []).append(j)
        return out


class Heartbeats(Protocol):
    """Where the engine learns which agents went silent (the HTTP API's heartbeat tracker)."""

    def silent(self, now: float, after_s: float) -> list[str]:
        """Nodes whose agent beat once but not within ``after_s`` s before ``now`` (mono)."""
        ...


#: One reconcile step: its name (what the log says when it fails) and what it does with the
#: step's snapshot at the tick's instant.
ReconcileStep = tuple[str, Callable[[Snapshot, Stamp], None]]


class Reconciler:
    """The engine's reconcile tick (its worker thread only): :attr:`steps` in order."""

    def __init__(
        self,
        *,
        journal: Journal,
        slurm: SlurmControl,
        clock: Clock,
        rules: Rules,
        executor: Executor,
        watch: JobWatch,
        kube: KubeFollow | None,
        heartbeats: Heartbeats | None,
        checker: RepairChecker | None,
        suspect_after_s: float,
        log: Callable[[str], None],
        wake: Callable[[], None],
        repaired: Callable[[str, str], object],
        validator: Validator | None = None,
    ) -> None:
        """``wake``: new events were journaled (decide them at once); ``repaired(node,
        why)``: return a node to the pool as `recover node repaired` does (UsageError when
        refused)."""
        self._journal = journal
        self._slurm = slurm
        self._clock = clock
        self._rules = rules
        self._executor = executor
        self._watch = watch
        self._kube = kube
        self._heartbeats = heartbeats
        self._checker = checker
        self._suspect_after_s = suspect_after_s
        self._log = log
        self._wake = wake
        self._repaired = repaired
        self._validator = validator
        self._checked: dict[str, float] = {}
        self._back_since: dict[str, float] = {}  # node -> when it was first seen back (mono)
        self._held_since: dict[tuple[str, int], float] = {}  # (job, run) -> first seen held
        self.suspects: frozenset[str] = frozenset()
        """Nodes whose agent is silent, as of the last ``heartbeats`` step."""
        self.steps: tuple[ReconcileStep, ...] = (
            ("unreachable-nodes", self._unreachable_nodes),
            ("saves", self._saves),
            ("validation", self._validation),
            ("promotions", self._promotions),
            ("operator-take-outs", self._operator_take_outs),
            ("back-in-service", self._back_in_service),
            ("held-expiry", self._held_expiry),
            ("heartbeats", self._watch_heartbeats),
            ("repair-checks", self._repair_checks),
            ("kubernetes", self._kubernetes),
            ("ended-jobs", self._ended_jobs),
            ("held-jobs", self._held_jobs),
            ("incidents", self._incidents),
        )

    def run(self, seen: Snapshot) -> None:
        """Every step once, in order, against ``seen``; a step that raises is logged by its
        name and the next one runs."""
        now = self._clock.now()
        for name, step in self.steps:
            try:
                step(seen, now)
            except Deposed:
                raise  # no step may act any more: the replica stops its engine
            except TransientError as e:
                self._log(f"reconcile step {name}: {e}; retrying next tick")
            except Exception:  # one step's failure must not stop the others; it is logged
                self._log(f"reconcile step {name} failed:\n{traceback.format_exc()}")

    # --- the steps ------------------------------------------------------------------------

    def _unreachable_nodes(self, seen: Snapshot, now: Stamp) -> None:
        open_nodes = {i.node for i in self._journal.incidents(open_only=True)}
        fresh = unreachable_events(seen.nodes, open_nodes, now.wall)
        if fresh and any(self._journal.append_events(fresh, now)):
            self._wake()

    def _waiting(self) -> list[ActionRecord]:
        return [r for r in self._journal.pending_actions() if r.status == ActionStatus.waiting]

    def _saves(self, seen: Snapshot, now: Stamp) -> None:
        for rec in self._waiting():
            if isinstance(rec.action, SaveThenRequeue):
                self._executor.finish_save(rec)

    def _promotions(self, seen: Snapshot, now: Stamp) -> None:
        """The spares promised are those the planned promotions name (the policy forgets any
        other). A waiting promotion's spare is gone, or the pool was empty when it was
        decided: the policy chooses again from the pool as it is now, the choice is
        recorded, and the promotion runs."""
        pending = self._journal.pending_actions()
        self._rules.still_promised(spares_promised(pending))
        waiting = [
            r
            for r in pending
            if r.status == ActionStatus.waiting and isinstance(r.action, PromoteSpare)
        ]
        promised = self._rules.promised
        if not waiting or all(
            n.name in promised for n in self._rules.view(seen.nodes).ready_spares
        ):
            return  # nothing waits, or the pool is empty: they wait for a spare
        ready = self._executor.ready_spares()
        for rec in waiting:
            if self._validator is not None:
                # Its spare is being checked (out of the pool for its burn-in): the choice
                # stands until the verdict is in.
                info = self._journal.incident(rec.incident).info
                assert isinstance(rec.action, PromoteSpare)
                current = info.get("spare_rechosen", rec.action.spare)
                if current is not None and self._validator.busy(current):
                    continue
            node = rec.action.node
            pick = self._rules.choose_spare(ready, seen.by_name.get(node) or node)
            if pick is None:
                return
            self._journal.update_incident(rec.incident, info={"spare_rechosen": pick.name})
            self._executor.retry_promotion(rec)

    def _validation(self, seen: Snapshot, now: Stamp) -> None:
        """What the checks found, applied: a spare whose last check failed is held out with
        the failed check as its reason (and the promotion that waited on it is told, and
        chooses again); a node so held whose last check passed goes back to the pool."""
        v = self._validator
        if v is None:
            return
        for out in v.take_outcomes():
            check = out.check
            if out.incident:
                # Every check a promotion waited on, in its incident (phases keep the first).
                info = self._journal.incident(out.incident).info
                note = SpareCheckNote(
                    spare=check.node, verdict=check.verdict, took_s=check.took_s, at=check.at,
                    detail=check.failed.detail if check.failed else "",
                )  # fmt: skip
                kept = [*info.get("spare_checks", []), note]
                self._journal.update_incident(out.incident, info={"spare_checks": kept})
                took = f"{check.took_s:.1f} s"
                if check.passed:
                    detail = f"{check.node}: {check.verdict} in {took}"
                    self._journal.add_phase(
                        out.incident, Phase(PhaseName.spare_checked, now, detail)
                    )
                else:
                    bad = check.failed
                    words = f"{bad.name}: {bad.detail}" if bad is not None else check.verdict
                    detail = f"{check.node}: failed its check ({words}) in {took}"
                    self._journal.add_phase(
                        out.incident, Phase(PhaseName.spare_rejected, now, detail)
                    )
            self._log(f"validation: {check.node} {check.verdict}")
        for node in seen.nodes:
            if v.claims.holder(node.name) is not None or v.busy(node.name):
                continue
            last = v.last(node.name)
            if last is None:
                continue
            # Only a verdict on the spare itself holds it (not one from before it was one).
            if is_spare(node) and not last.passed and last.standing == "spare":
                self._slurm.drain(node.name, last.hold_reason())
                self._executor.forget_spare(node.name)
                self._log(f"validation: {node.name} held out: {last.hold_reason()}")
            elif node.reason.startswith(CHECK_FAILED_PREFIX) and last.passed:
                self._slurm.drain(node.name, SPARE_REASON)
                self._log(f"validation: {node.name} back in the pool ({last.verdict})")

    def _operator_take_outs(self, seen: Snapshot, now: Stamp) -> None:
        if self._kube is None:
            return
        for rec in self._waiting():
            if isinstance(rec.action, TakeDown | Drain):
                node = seen.by_name.get(rec.action.node)
                self._kube.finish_operator_take_out(rec, node, self._slurm)

    def _back_in_service(self, seen: Snapshot, now: Stamp) -> None:
        """A node the policy holds out that Slurm shows in service, with no take-out of ours
        still to run, for :data:`BACK_AFTER_S`: someone returned it without us (``scontrol
        update state=resume`` after a quick reboot, a cluster started anew on this journal).
        Slurm's truth wins over the journal: a ``node-returned`` event ends the incident's
        hold, so a new fault there is acted on (and counted) instead of joining it."""
        pending = {
            rec.action.node
            for rec in self._journal.pending_actions()
            if isinstance(rec.action, TakeDown | Drain)
        }
        back = set()
        for name in self._rules.out_nodes():
            node = seen.by_name.get(name)
            if node is None or not node.in_service or name in pending:
                continue
            back.add(name)
            since = self._back_since.setdefault(name, now.mono)
            if now.mono - since < BACK_AFTER_S:
                continue
            event = HealthEvent(
                id=f"returned-{name}-{int(now.wall * 1000)}",
                node=name,
                source=Source.operator,
                fault=RETURNED,
                observed_at=now.wall,
                message=(
                    f"{name} is in service again ({describe_state(node)}) without recover "
                    "returning it: resumed by someone, or the cluster started anew"
                ),
            )
            self._journal.append_events([event], now)
            self._log(f"reconcile: {event.message}")
            back.discard(name)
            self._wake()
        self._back_since = {n: t for n, t in self._back_since.items() if n in back}

    def _held_jobs(self, seen: Snapshot, now: Stamp) -> None:
        """Jobs of ours Slurm holds (REQUEUE_HOLD) that no open incident follows, held for
        :data:`HELD_GRACE_S`: a ``job-held`` event opens an incident that says how the run
        ended; on the next pass the job is released (:func:`judge_held`, through
        ``requeue_ended``, which acts once per run) and followed until it runs again, or the
        incident is closed saying why it is left held. Runs on start-up too: the journal
        needs no memory of the job."""
        held = [j for j in seen.jobs if j.requeue_held and ours(j)]
        open_incidents = self._journal.incidents(open_only=True)
        waiting = [i for i in open_incidents if i.fault == HELD and not i.jobs]
        if not held and not waiting and not self._held_since:
            return  # the common case: one read of the open incidents, as the next step does
        followed = {j for inc in open_incidents for j in inc.jobs}
        incidents: list[IncidentRecord] | None = None  # every incident, read when needed
        held_now = set()
        for job in held:
            if job.job_id in followed:
                continue
            ran = job.restart_count - 1
            held_now.add((job.job_id, ran))
            since = self._held_since.setdefault((job.job_id, ran), now.mono)
            if now.mono - since < HELD_GRACE_S:
                continue
            if incidents is None:
                incidents = self._journal.incidents()
            event_id = f"held-{job.job_id}-{ran}"
            inc = next((i for i in incidents if i.id == incident_id(event_id)), None)
            if inc is None:
                self._report_held(job, ran, event_id, seen, now)
            elif inc.status is IncidentStatus.open:
                self._settle_held(inc, job, ran, incidents, now)
        self._held_since = {k: t for k, t in self._held_since.items() if k in held_now}
        for inc in waiting:  # held incidents whose job stopped being held before we acted
            job_id, _, run = inc.event_ids[0].removeprefix("held-").rpartition("-")
            if job_id in followed:
                why = f"job {job_id} is followed by the incident of a node's fault"
            elif (job_id, int(run or -1)) not in held_now:
                why = f"job {job_id} is no longer held: released or ended by someone else"
            else:
                continue
            self._journal.close_incident(inc.id, now, why)

    def _report_held(
        self, job: JobInfo, ran: int, event_id: str, seen: Snapshot, now: Stamp
    ) -> None:
        ran_on = sorted(self._watch.trail.ran_on(job.job_id).get(ran, ()))
        node = job.batch_host or (ran_on[0] if ran_on else None)
        if node is None or node not in seen.by_name:
            node = seen.nodes[0].name if seen.nodes else None
        if node is None:
            return
        event = HealthEvent(
            id=event_id,
            node=node,
            source=Source.slurm,
            fault=HELD,
            observed_at=now.wall,
            message=(
                f"job {job.job_id} ({job.name}) is held by Slurm (REQUEUE_HOLD) after its run "
                f"{ran} ended ({describe_end(job)}) with no node's fault to explain it"
            ),
        )
        if self._journal.append_events([event], now)[0]:
            self._log(f"reconcile: {event.message}")
            self._wake()

    def _settle_held(
        self,
        inc: IncidentRecord,
        job: JobInfo,
        ran: int,
        incidents: list[IncidentRecord],
        now: Stamp,
    ) -> None:
        window = now.wall - self._rules.config.requeue.budget_window_s
        released = sum(
            1
            for other in incidents
            if other.fault == HELD
            and job.job_id in other.jobs
            and other.opened.wall >= window
            and any(p.name == PhaseName.job_released for p in other.phases)
        )
        release, why = judge_held(job, released, self._rules.config.requeue.budget)
        if not release:
            self._journal.close_incident(inc.id, now, f"left held: {why}")
            self._log(f"reconcile: job {job.job_id} left held: {why}")
            return
        # Followed from here (job-running, closed), at the count of the run that ended.
        self._journal.update_incident(
            inc.id,
            jobs=[job.job_id],
            info={"job_restarts": {job.job_id: ran}, "path": JobPath.released},
        )
        self._slurm.requeue_ended(job.job_id, ran)
        self._journal.add_phase(inc.id, Phase(PhaseName.job_released, now, f"{job.job_id}: {why}"))
        self._log(f"reconcile: job {job.job_id} released: {why}")

    def _held_expiry(self, seen: Snapshot, now: Stamp) -> None:
        expire_held(self._journal, self._rules.hold_max_age_s, now)

    def _watch_heartbeats(self, seen: Snapshot, now: Stamp) -> None:
        """A node whose agent fell silent becomes a suspect: one ``heartbeat-lost`` event per
        silence, journaled and decided like any other (the policy says what it means)."""
        if self._heartbeats is None:
            return
        silent = frozenset(self._heartbeats.silent(now.mono, self._suspect_after_s))
        fresh = [
            HealthEvent(
                id=f"heartbeat-lost-{node}-{int(now.wall)}",
                node=node,
                source=Source.heartbeat,
                fault=HEARTBEAT_LOST,
                observed_at=now.wall,
                message=f"no heartbeat from the agent for {self._suspect_after_s:g} s",
            )
            for node in sorted(silent - self.suspects)
        ]
        self.suspects = silent
        if fresh:
            self._journal.append_events(fresh, now)
            self._wake()

    def _repair_checks(self, seen: Snapshot, now: Stamp) -> None:
        """Every ``repair_check.interval_s`` seconds, check each node we hold out; one that
        passes goes back to the pool exactly as `recover node repaired` would send it."""
        check = self._rules.config.repair_check
        if check is None or self._checker is None:
            return
        for node in self._rules.out_nodes():
            if now.mono - self._checked.get(node, -1e18) < check.interval_s:
                continue
            self._checked[node] = now.mono
            if not self._checker.passes(node):
                continue
            try:
                self._repaired(node, "repair check passed")
            except UsageError as e:  # flapping, or someone else holds it now: it stays out
                self._log(f"repair check passed for {node}, but it stays out: {e}")

    def _kubernetes(self, seen: Snapshot, now: Stamp) -> None:
        if self._kube is None:
            return
        seen_at = seen.at.mono if seen.at else None
        self._kube.reconcile(self._journal.incidents(open_only=True), seen.by_name, seen_at)

    def _ended_jobs(self, seen: Snapshot, now: Stamp) -> None:
        """Jobs of a node taken out that ended before Slurm could requeue them: requeued,
        or the reason why not recorded (:mod:`recovery.coordinator.jobwatch`)."""
        incidents = self._journal.incidents(open_only=True)
        self._watch.step(incidents, seen.jobs_by_node, seen.jobs_by_id)

    def _incidents(self, seen: Snapshot, now: Stamp) -> None:
        """Phases the jobs reached; an incident whose actions are settled, whose jobs run
        again (or ended) and whose Kubernetes steps are done is closed."""
        for inc in self._journal.incidents(open_only=True):
            if inc.fault == HELD and (
                not inc.jobs
                or any((j := seen.jobs_by_id.get(job)) and j.requeue_held for job in inc.jobs)
            ):
                continue  # named and released by the held-jobs step: wait until Slurm says so
            progress = follow_jobs(inc, seen.jobs_by_id, self._watch.awaiting(inc.id))
            for name, detail in progress.phases:
                self._journal.add_phase(inc.id, Phase(name, now, detail))
            kube_done = self._kube is None or finished(inc, self._kube.mode)
            if progress.resolved and settled(inc) and kube_done:
                why = "jobs running again" if inc.jobs else "no job ran on the node"
                self._journal.close_incident(inc.id, now, f"actions done; {why}")
