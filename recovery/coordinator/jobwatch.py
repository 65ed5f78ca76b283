"""The jobs of a faulted node that Slurm did not requeue: found, recorded, requeued once.

Which jobs an incident follows (:meth:`JobWatch.at_decision`, when it opens):

* the jobs live on the node (what the incident always recorded);
* the jobs that ran on the node and ended abnormally at most ``requeue.window_s`` before the
  fault (the process died first: XID 79 kills it at once, and the event can arrive later);
* the jobs completing elsewhere that a tick saw on the node at the same restart count
  (Slurm lists only the nodes a completing job has not yet released: the process on the
  node died, the step was killed everywhere, and the node's Epilog finished first);
* the jobs Slurm requeued from the node since a tick saw them there (a slurmd crash: Slurm
  sets the node DOWN and requeues its jobs in one instant, before the coordinator looks; a
  multi-node job then shows COMPLETING at its new restart count on its other nodes, with the
  lost node already gone from its list). :class:`JobTrail` keeps, per job, where it ran at
  each restart count.

Each job is recorded with the restart count of its run on the node
(``IncidentInfo.job_restarts``). Once the incident has acted on the node (the take-out, or the
requeue of a restart-app verdict, is done), the ``ended-jobs`` reconcile step
(:meth:`JobWatch.step`) judges every followed job that ended abnormally at that count with
:func:`recovery.policy.requeue.judge`, and requeues it, or records why not. It keeps watching
on every tick while the incident is open: a job that was on the node when the fault was
decided keeps the incident open until it is requeued (by Slurm, its wrapper, or here), runs
again, or ended; a job ending abnormally on the node up to ``window_s`` after the take-out is
caught too (the node taken out first, the process dying a moment later).

Restart safety: the requeue of run ``(job, restart count)`` is noted in the incident
(``IncidentInfo.requeues``, outcome ``noted``) before it is asked for, and asked for through
:meth:`recovery.ports.slurm.SlurmControl.requeue_ended`, which acts only while the job is still
finished at that count. A coordinator killed anywhere in between asks again after its restart,
which is a no-op once the first request landed (the count rose): one run is never requeued
twice, whichever incidents see it. The budget counts the noted runs, rebuilt from the journal
on start. The trail lives in memory: after a restart it starts from what Slurm shows then.

Slurm 25.11 may have requeued such a run itself and hold it (``REQUEUE_HOLD``: an expedited
job whose script failed while no Epilog failed, because the training died before the fault
was reported). The trail follows it (seen on the node at the count before), it is judged
like a failed run, and its requeue is its release (``requeue_ended`` releases it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from recovery.errors import RecoverError, TransientError, UsageError
from recovery.model import Drain, RequeueJobs, TakeDown
from recovery.policy.requeue import (
    RequeueConfig,
    budget_used,
    describe_end,
    ended_on,
    held_by_slurm,
    judge,
    judge_headless,
    lost_batch_host,
)
from recovery.ports.clock import Clock, Stamp
from recovery.ports.journal import (
    ActionStatus,
    IncidentRecord,
    Journal,
    Phase,
    PhaseName,
    RequeueNote,
    RequeueOutcome,
)
from recovery.ports.slurm import ON_NODE_JOB_STATES, JobInfo, SlurmControl

_UNSETTLED = frozenset({ActionStatus.planned, ActionStatus.waiting, ActionStatus.held})


@dataclass
class _Run:
    nodes: set[str]
    last_seen: float


class JobTrail:
    """Where each job ran at each restart count, as the ticks saw it (memory only; a job
    slurmctld forgot is forgotten here too). Indexed by node, so that a decision in a storm
    reads only the jobs of its node."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[int, _Run]] = {}
        self._by_node: dict[str, set[str]] = {}

    def observe(self, jobs: Iterable[JobInfo], at: float) -> None:
        """Fold one snapshot of Slurm's jobs, read at ``at`` (Unix seconds)."""
        known: set[str] = set()
        for j in jobs:
            known.add(j.job_id)
            if j.state in ON_NODE_JOB_STATES and j.nodes:
                runs = self._runs.setdefault(j.job_id, {})
                run = runs.setdefault(j.restart_count, _Run(set(), at))
                run.nodes.update(j.nodes)
                run.last_seen = at
                for n in j.nodes:
                    self._by_node.setdefault(n, set()).add(j.job_id)
        for gone in set(self._runs) - known:
            for run in self._runs.pop(gone).values():
                for n in run.nodes:
                    self._by_node.get(n, set()).discard(gone)

    def ran_on(self, job_id: str) -> dict[int, frozenset[str]]:
        """The nodes ``job_id`` was seen on, per restart count."""
        return {c: frozenset(r.nodes) for c, r in self._runs.get(job_id, {}).items()}

    def _seen_now(self, node: str, jobs: Mapping[str, JobInfo], since: float) -> list[JobInfo]:
        """Jobs a tick saw on ``node`` at or after ``since`` at their restart count now."""
        out: list[JobInfo] = []
        for job_id in self._by_node.get(node, ()):
            job = jobs.get(job_id)
            run = self._runs.get(job_id, {}).get(job.restart_count) if job else None
            if job is not None and run is not None and node in run.nodes and run.last_seen >= since:
                out.append(job)
        return out

    def headless_from(self, node: str, jobs: Mapping[str, JobInfo], since: float) -> dict[str, int]:
        """Jobs seen on ``node`` at or after ``since`` that run on without it, their batch
        host (:func:`recovery.policy.requeue.lost_batch_host`), each with its restart count."""
        return {
            j.job_id: j.restart_count
            for j in self._seen_now(node, jobs, since)
            if lost_batch_host(j, node, j.restart_count)
        }

    def released_by(self, node: str, jobs: Mapping[str, JobInfo], since: float) -> dict[str, int]:
        """Jobs seen on ``node`` at or after ``since`` that are COMPLETING at the same restart
        count without it, each with that count. Slurm lists only the nodes a completing job
        has not yet released: a multi-node job whose process on ``node`` died first (the
        step killed everywhere, ``node``'s Epilog done soonest) no longer names ``node``
        while it completes on the others, then names all of them again once it ended."""
        return {
            j.job_id: j.restart_count
            for j in self._seen_now(node, jobs, since)
            if j.state == "COMPLETING" and node not in j.nodes
        }

    def requeued_from(self, node: str, jobs: Mapping[str, JobInfo], since: float) -> dict[str, int]:
        """Jobs seen on ``node`` at or after ``since`` at a restart count lower than their count
        now (so requeued since), each with the newest such count."""
        out: dict[str, int] = {}
        for job_id in self._by_node.get(node, ()):
            job = jobs.get(job_id)
            if job is None:
                continue
            there = [
                c
                for c, r in self._runs[job_id].items()
                if node in r.nodes and r.last_seen >= since and c < job.restart_count
            ]
            if there:
                out[job_id] = max(there)
        return out


class Stage(Enum):
    """How far an incident got with its node, as far as its jobs are concerned."""

    none = "none"
    """It moves no jobs (no take-out, no requeue): ended jobs are not its business."""
    wait = "wait"
    """Its take-out (or requeue) is still to come: requeueing now could land on the node."""
    acted = "acted"
    dry_run = "dry-run"
    never = "never"
    """Its take-out failed or expired: the node is still in service."""


def stage(incident: IncidentRecord) -> tuple[Stage, float | None]:
    """Where ``incident`` stands (:class:`Stage`) and, once it acted, when (Unix seconds).
    Pure."""
    takeouts = [a for a in incident.actions if isinstance(a.action, TakeDown | Drain)]
    movers = takeouts + [a for a in incident.actions if isinstance(a.action, RequeueJobs)]
    if not movers:
        return Stage.none, None
    if any(a.status in _UNSETTLED for a in takeouts):
        return Stage.wait, None
    done = [a.finished.wall for a in movers if a.status == ActionStatus.done and a.finished]
    if done:
        return Stage.acted, min(done)
    if any(a.status in _UNSETTLED for a in movers):
        return Stage.wait, None
    if any(a.status == ActionStatus.skipped for a in movers):
        return Stage.dry_run, None
    return Stage.never, None


def fault_time(incident: IncidentRecord) -> float:
    """When the incident's fault happened as best known (Unix seconds): the agent's
    observation, else the receipt, else the opening."""
    for name in (PhaseName.fault, PhaseName.received):
        found = [p.at.wall for p in incident.phases if p.name == name]
        if found:
            return min(found)
    return incident.opened.wall


@dataclass(frozen=True)
class _Tick:
    """What one incident's turn found, written as one phase each."""

    ended: tuple[str, ...] = ()
    requeued: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Judged:
    """One ended run judged (:meth:`JobWatch._judge`): its note, and its lines for the
    incident's phases."""

    note: RequeueNote
    ended: str
    """For the ``job-ended`` phase: the job and how it ended."""
    refused: str | None = None
    """For the ``requeue-refused`` phase, when it is not requeued."""


@dataclass(frozen=True)
class _Asked:
    """One noted requeue asked of Slurm (:meth:`JobWatch._request`): the note after it, and
    its line for the incident's phases, if it settled."""

    note: RequeueNote
    requeued: str | None = None
    """For the ``jobs-requeued`` phase."""
    refused: str | None = None
    """For the ``requeue-refused`` phase."""


class JobWatch:
    """Finds the jobs a fault ended and requeues them (the engine's worker thread only)."""

    def __init__(
        self,
        *,
        journal: Journal,
        slurm: SlurmControl,
        clock: Clock,
        config: Callable[[], RequeueConfig],
        log: Callable[[str], None],
    ) -> None:
        """``config``: the policy's requeue settings (read when used). A dry run shows in the
        incident's actions (``skipped``), which decide what happens here."""
        self._journal = journal
        self._slurm = slurm
        self._clock = clock
        self._config = config
        self._log = log
        self.trail = JobTrail()
        self._noted: dict[str, dict[int, float]] = {}
        """Per job, the runs (restart counts) whose requeue was noted, and when."""
        self._awaiting: dict[str, frozenset[str]] = {}

    def recover(self) -> None:
        """Rebuild what was requeued from the journal (every incident's notes)."""
        self._noted = {}
        for inc in self._journal.incidents():
            for job_id, note in inc.info.get("requeues", {}).items():
                if note["outcome"] in (RequeueOutcome.noted, RequeueOutcome.requeued):
                    self._noted.setdefault(job_id, {})[int(note["restart_count"])] = note["at"]

    def observe(self, jobs: Iterable[JobInfo], at: float) -> None:
        """One snapshot of Slurm's jobs, read at ``at`` (Unix seconds)."""
        self.trail.observe(jobs, at)

    def awaiting(self, incident: str) -> frozenset[str]:
        """Jobs of ``incident`` whose requeue is noted but not confirmed: still unresolved."""
        return self._awaiting.get(incident, frozenset())

    # --- when an incident opens -------------------------------------------------------------

    def at_decision(
        self,
        node: str,
        fault_at: float,
        listing: Iterable[JobInfo],
        jobs: Mapping[str, JobInfo],
        now: float,
        *,
        moves_jobs: bool = True,
    ) -> dict[str, int]:
        """The jobs an incident on ``node`` whose fault happened at ``fault_at`` follows, each
        with the restart count of its run on the node (see the module's docstring), in job
        id order. ``listing``: the jobs whose node list names ``node``; ``jobs``: every job by
        id; times in Unix seconds. An incident that ``moves_jobs`` not (its verdict neither
        takes the node out nor requeues) follows only the live ones."""
        since = fault_at - self._config().window_s
        live: dict[str, int] = {}
        ended: dict[str, int] = {}
        for j in listing:
            if j.active:
                live[j.job_id] = j.restart_count
            elif moves_jobs and ended_on(j, node, since, now):
                ended[j.job_id] = j.restart_count
        # Live too, though a completing job's listing may already have let go of the node.
        live.update(self.trail.released_by(node, jobs, since))
        moved = self.trail.requeued_from(node, jobs, since) if moves_jobs else {}
        # Slurm 25.11 drops a DOWN batch host from a --no-kill job, before the coordinator
        # looks: the job no longer lists the node but still needs it.
        headless = self.trail.headless_from(node, jobs, since) if moves_jobs else {}
        found = {**moved, **headless, **ended, **live}
        return {k: found[k] for k in sorted(found, key=_job_order)}

    # --- the reconcile step -----------------------------------------------------------------

    def step(
        self,
        incidents: Iterable[IncidentRecord],
        by_node: Mapping[str, Sequence[JobInfo]],
        by_id: Mapping[str, JobInfo],
    ) -> None:
        """The ``ended-jobs`` step: every open incident's ended jobs judged, and requeued or
        refused (see the module's docstring). ``by_node``: the jobs whose node list names
        each node; ``by_id``: every job."""
        awaiting: dict[str, frozenset[str]] = {}
        for inc in incidents:
            waits = self._follow(inc, by_node.get(inc.node, ()), by_id)
            if waits:
                awaiting[inc.id] = frozenset(waits)
        self._awaiting = awaiting

    def _follow(
        self, inc: IncidentRecord, listing: Sequence[JobInfo], by_id: Mapping[str, JobInfo]
    ) -> list[str]:
        where, acted_at = stage(inc)
        if where in (Stage.none, Stage.wait):
            return []
        config = self._config()
        now = self._clock.now()
        restarts = {k: int(v) for k, v in inc.info.get("job_restarts", {}).items()}
        # The node taken out first, the job dying a moment later: caught until window_s
        # after the take-out, as long as the incident is open.
        since = fault_time(inc) - config.window_s
        until = (acted_at if acted_at is not None else now.wall) + config.window_s
        late = {
            j.job_id: j.restart_count
            for j in listing
            if j.job_id not in restarts and ended_on(j, inc.node, since, until)
        }
        if late:
            restarts.update(late)
            self._journal.update_incident(
                inc.id, jobs=[*inc.jobs, *late], info={"job_restarts": restarts}
            )
        notes = dict(inc.info.get("requeues", {}))
        judged: list[_Judged] = []
        for job_id in [*inc.jobs, *late]:
            job = by_id.get(job_id)
            if job_id in notes or job is None:
                continue
            ran_at = restarts.get(job_id, 0)
            found = self._judge(inc, job, ran_at, where, config, now)
            if found is None:
                continue
            notes[job_id] = found.note
            if found.note["outcome"] == RequeueOutcome.noted:
                self._noted.setdefault(job_id, {})[ran_at] = now.wall
            judged.append(found)
        if judged:
            # The phases first, then the notes: a restart in between judges again, the same.
            self._phases(
                inc,
                _Tick(
                    ended=tuple(j.ended for j in judged),
                    refused=tuple(j.refused for j in judged if j.refused is not None),
                ),
            )
            # Noted before any request: a restart asks Slurm again instead of judging again.
            self._journal.update_incident(inc.id, info={"requeues": notes})
        asked: list[_Asked] = []
        for job_id, note in list(notes.items()):
            if note["outcome"] != RequeueOutcome.noted:
                continue
            answer = self._request(job_id, note, by_id.get(job_id), inc.node)
            asked.append(answer)
            if answer.note["outcome"] != RequeueOutcome.noted:  # noted: asked again next tick
                notes[job_id] = answer.note
                self._journal.update_incident(inc.id, info={"requeues": notes})
        self._phases(
            inc,
            _Tick(
                requeued=tuple(a.requeued for a in asked if a.requeued is not None),
                refused=tuple(a.refused for a in asked if a.refused is not None),
            ),
        )
        # Unresolved while this tick's snapshot still shows the run ended: asked for and not
        # confirmed (a transient error), or requeued during this very tick.
        return [
            job_id
            for job_id, note in notes.items()
            if note["outcome"] in (RequeueOutcome.noted, RequeueOutcome.requeued)
            and (job := by_id.get(job_id)) is not None
            and (
                (job.finished and job.restart_count == note["restart_count"])
                or held_by_slurm(job, note["restart_count"])
                or lost_batch_host(job, inc.node, note["restart_count"])
            )
        ]

    def _phases(self, inc: IncidentRecord, tick: _Tick) -> None:
        for name, items in (
            (PhaseName.job_ended, tick.ended),
            (PhaseName.requeue_refused, tick.refused),
            (PhaseName.jobs_requeued, tick.requeued),
        ):
            if items:
                self._journal.add_phase(inc.id, Phase(name, self._clock.now(), "; ".join(items)))

    def _judge(
        self,
        inc: IncidentRecord,
        job: JobInfo,
        ran_at: int,
        where: Stage,
        config: RequeueConfig,
        now: Stamp,
    ) -> _Judged | None:
        """The run ``(job, ran_at)`` judged: its note (outcome ``noted`` when it is to be
        requeued) and its phase lines; None when it is not ours to judge
        (:func:`recovery.policy.requeue.judge`)."""
        used = budget_used(
            (at for c, at in self._noted.get(job.job_id, {}).items() if c != ran_at),
            now.wall,
            config,
        )
        headless = lost_batch_host(job, inc.node, ran_at)
        verdict = (
            judge_headless(job, used=used, config=config)
            if headless
            else judge(job, ran_at, used=used, config=config)
        )
        if verdict is None:
            return None
        # A run Slurm holds has no end time left (Slurm clears it at the requeue).
        ended = (
            f"RUNNING without its batch host {inc.node}"
            if headless
            else describe_end(job) + (f" at {job.end_time:.0f}" if job.end_time else "")
        )
        line = f"{job.job_id} {ended}"

        def note(outcome: RequeueOutcome, detail: str) -> RequeueNote:
            return RequeueNote(
                restart_count=ran_at, ended=ended, outcome=outcome, detail=detail, at=now.wall
            )

        if where is Stage.never:
            why = f"the take-out of {inc.node} never ran, so it would land there again"
            return _Judged(note(RequeueOutcome.refused, why), line, f"{job.job_id}: {why}")
        if where is Stage.dry_run:
            return _Judged(
                note(RequeueOutcome.skipped, "dry run: decided, not applied"),
                line,
                f"{job.job_id}: dry run: it would be requeued",
            )
        if not verdict.requeue:
            return _Judged(
                note(RequeueOutcome.refused, verdict.why), line, f"{job.job_id}: {verdict.why}"
            )
        return _Judged(note(RequeueOutcome.noted, "requeue asked of Slurm"), line)

    def _request(
        self,
        job_id: str,
        note: RequeueNote,
        job: JobInfo | None = None,
        node: str = "",
    ) -> _Asked:
        """Ask Slurm for the requeue ``note`` records: the note after it (still ``noted``
        after a transient error, to be asked again) and its phase line."""
        ran_at = note["restart_count"]
        try:
            if job is not None and lost_batch_host(job, node, ran_at):
                # Still running (headless) at the run noted: requeued as it is. A later tick
                # (or restart) sees the count risen and asks nothing more.
                changed = self._slurm.requeue(job_id)
            else:
                changed = self._slurm.requeue_ended(job_id, ran_at)
        except TransientError as e:
            self._log(f"requeue of ended job {job_id}: {e}; will retry")
            return _Asked(note)
        except UsageError:
            why = "slurmctld no longer knows it (it forgets ended jobs after MinJobAge)"
            return _Asked(_with(note, RequeueOutcome.refused, why), refused=f"{job_id}: {why}")
        except RecoverError as e:  # refused (--no-requeue after all), or unsupported here
            return _Asked(_with(note, RequeueOutcome.refused, str(e)), refused=f"{job_id}: {e}")
        # False: the run was requeued already (our request before a restart, or another's).
        how = "requeued by the coordinator" if changed else "requeued already"
        return _Asked(
            _with(note, RequeueOutcome.requeued, how),
            requeued=f"{job_id} ({note['ended']}; {how})",
        )


def _with(note: RequeueNote, outcome: RequeueOutcome, detail: str) -> RequeueNote:
    return RequeueNote(
        restart_count=note["restart_count"],
        ended=note["ended"],
        outcome=outcome,
        detail=detail,
        at=note["at"],
    )


def _job_order(job_id: str) -> tuple[int, str]:
    head = job_id.split("_", 1)[0].split("+", 1)[0]
    return (int(head) if head.isdigit() else 0, job_id)
