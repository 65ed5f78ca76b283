"""Where one incident's time went: the journal's phases joined with the job's event log.

The chain from the fault to training again, each phase starting where the one before ended::

    fault ─detection─► decided ─take_out─► node down/drained ─┐
    fault ─stall─► every process of the job stopped ──────────┴─ the later of the two
    ─requeue_wait─► job running again in Slurm ─job_restart─► process started ─restore─►
    restored ─warmup─► first update begins ─recompute─► the step reached before is reached again

Slurm can run the job again only once the node is out *and* every process of the job has
stopped (the others stop by themselves when one dies: see docs/multiprocess.md), so the chain
goes through whichever came later: ``stall`` (fault to the last process stopped) or
``detection`` + ``take_out``. :attr:`IncidentPhases.chain` names the phases of this
incident's chain; they add up to fault -> training again. ``replacement`` (fault to spare
promoted) runs beside the chain, and ``no_progress`` covers it all: from the last update
before the restart to the first update beyond it. Durations are in seconds; a phase that did
not happen is None and :attr:`IncidentPhases.why` says why.

A stall (hung or frozen rank) that the job's in-allocation supervisor handles has its own
instants, from the supervisor's journal: ``detection`` ends when the supervisor noticed it,
``diagnose`` when it had every rank's stacks, and ``stall`` when it had ended the launch; the
relaunch follows (``job_restart`` from the launch ended). On the requeue path the agents take
the stacks as they see the stall, before the coordinator decides.
Pure: records in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from recovery.contract.jobmark import PROGRESS_FAULTS
from recovery.model import PromoteSpare
from recovery.ports.journal import PhaseName
from recovery.report.processes import Fallback, Process
from recovery.report.restarts import high_water, redo, redo_why, span
from recovery.report.run import Fault, Incident, RunRecord, SupervisorEntry

#: The report's phases of every incident, in the order reports show them: spans between the
#: journal's phases (:class:`recovery.ports.journal.PhaseName`) and the job's events. A
#: Literal so that a scenario's ``expect.phases`` can answer a misspelt one with the names.
ReportPhase = Literal[
    "detection",
    "diagnose",
    "stall",
    "take_out",
    "requeue_wait",
    "replacement",
    "job_restart",
    "restore",
    "warmup",
    "recompute",
    "no_progress",
]
PHASES: tuple[str, ...] = get_args(ReportPhase)
#: How much earlier than the coordinator's record an injection may be matched to an incident.
MATCH_WINDOW_S = 600.0


@dataclass(frozen=True)
class IncidentPhases:
    phases: dict[str, float | None]
    """Seconds per name of :data:`PHASES`, exactly those keys."""
    why: dict[str, str]
    """For each phase that is None: why it did not happen."""
    marks: dict[str, float]
    """The instants the phases run between (wall seconds), by name: ``fault``, ``noticed``
    (the supervisor's or the coordinator's decision, whichever acted), ``stacks``, ``decided``,
    ``node_out``, ``requeued``, ``job_running``, ``spare_ready``, ``started``, ``restored``,
    ``first_step``, ``caught_up``, ``progress``, ``last_step_before``."""
    fault_at: float
    fault_source: str
    """Where ``fault_at`` comes from: the injection in run.json, or the agent's observation."""
    restored_step: int | None
    high_water_step: int | None
    """The last step reached before the restart (by any earlier process)."""
    steps_recomputed: int | None
    fallbacks: tuple[Fallback, ...]
    spare: str | None
    successor: int | None
    """Index of the process that restarted after the fault, if any."""
    chain: tuple[str, ...] = ()
    """The phases that add up to fault -> training again (first update of the restart)."""
    stopped: tuple[float | None, ...] = ()
    """Per rank: when its process running at the fault stopped (wall seconds; None: it was
    not running, or ran on to completion)."""
    supervised: bool = False
    """The job's own supervisor noticed the stall, stopped the launch and relaunched it
    inside the allocation (its journal's ``stalled``, ``stacks`` and ``step-ended``)."""


@dataclass(frozen=True)
class _Restart:
    process: Process | None
    high: int | None
    last_before: float | None
    recomputed: int = 0
    caught_up: float | None = None
    progress: float | None = None
    why: dict[str, str] = field(default_factory=dict)
    """Why a phase it measures did not happen, for those that did not."""


def match_fault(incident: Incident, faults: Sequence[Fault]) -> Fault | None:
    """The injection that caused ``incident``: same node, at or before the incident opened
    (within :data:`MATCH_WINDOW_S`), the latest such; a same-named fault wins a tie."""
    candidates = [
        f
        for f in faults
        if f.node == incident.node and incident.opened - MATCH_WINDOW_S <= f.at <= incident.opened
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda f: (f.at, f.fault == incident.fault))


def _fault_time(incident: Incident, run: RunRecord) -> tuple[float, str]:
    injected = match_fault(incident, run.faults)
    if injected is not None:
        return injected.at, f"injected via {injected.via}, per run.json"
    observed = incident.first(PhaseName.fault)
    if observed is not None:
        return observed.at, "observed by the agent (no injection in run.json)"
    return incident.opened, "the incident's opening (no injection or observation recorded)"


def _affects_job(incident: Incident, run: RunRecord) -> bool:
    return run.job.id in incident.jobs or incident.node in run.job.nodes


def _spare(incident: Incident) -> tuple[str | None, float | None, str | None]:
    """The spare promoted for ``incident`` and when; else None, None and why none was."""
    promote = [a for a in incident.actions if a.kind == PromoteSpare.kind]
    promoted = incident.first(PhaseName.spare_promoted)
    if promoted is not None:
        return promoted.detail or None, promoted.at, None
    if not promote:
        return None, None, f"verdict {incident.verdict} needs no spare: no promotion planned"
    if incident.first(PhaseName.no_spare) is not None:
        status = promote[0].status
        return None, None, f"the spare pool was empty; the promotion stayed {status}"
    a = promote[0]
    return None, None, f"the promotion is {a.status}: {a.detail or 'no detail'}"


def _restart(processes: Sequence[Process], fault_at: float, reason: str | None) -> _Restart:
    """What the job did after the fault: the first process started after it, the step the
    processes before it had reached, and how long the new one took to get back there
    (:func:`recovery.report.restarts.redo`). ``reason``: why no restart is looked for (the
    job was not on the node), or None."""
    succ = None if reason else next((p for p in processes if p.started > fault_at), None)
    if succ is None:
        high, last = high_water(processes)
        reason = reason or "the job did not start again after the fault before the run ended"
        names = ("requeue_wait", "job_restart", "restore", "warmup", "recompute", "no_progress")
        return _Restart(None, high, last, why=dict.fromkeys(names, reason))
    r = redo(processes, succ.index)
    return _Restart(
        succ,
        r.high_water_step,
        r.last_before,
        r.steps_recomputed,
        r.caught_up,
        r.progress,
        why=redo_why(succ, r),
    )


def _stopped(
    ranks: Sequence[Sequence[Process]], fault_at: float, ended: float | None = None
) -> tuple[float | None, ...]:
    """Per rank, when its process that was running at ``fault_at`` stopped: its last event,
    never before the fault (a process killed by it wrote nothing after its last update),
    nor before ``ended`` (when its supervisor saw the launch end: a hung process writes
    nothing after its last update either, yet runs until it is stopped). None for a rank
    with no process started before the fault, or one that completed."""
    out: list[float | None] = []
    for procs in ranks:
        live = [p for p in procs if p.started <= fault_at]
        if not live or live[-1].outcome == "completed":
            out.append(None)
        else:
            out.append(max(fault_at, live[-1].end, ended or fault_at))
    return tuple(out)


@dataclass(frozen=True)
class _Supervised:
    """A stall the job's in-allocation supervisor handled: it noticed, took the stacks (or
    gave up waiting for them), ended the launch."""

    noticed: SupervisorEntry
    stacks: SupervisorEntry | None
    ended: SupervisorEntry | None


def _supervised(incident: Incident, run: RunRecord, fault_at: float) -> _Supervised | None:
    """The supervisor's handling of ``incident``'s stall, when it was one of the faults the
    coordinator leaves to a job's supervisor and the supervisor journaled it."""
    if incident.fault not in PROGRESS_FAULTS:
        return None
    # The supervisor may notice before the fault's recorded instant by a clock's slack.
    noticed = run.supervised("stalled", fault_at - 1.0, fault_at + MATCH_WINDOW_S)
    if noticed is None:
        return None
    relaunched = run.supervised("launched", noticed.at)
    before = relaunched.at + 1e-6 if relaunched else None
    return _Supervised(
        noticed,
        run.supervised("stacks", noticed.at, before),
        run.supervised("step-ended", noticed.at, before),
    )


def _stacks_at(run: RunRecord, sup: _Supervised | None, fault_at: float) -> float | None:
    """When the stacks were captured: the supervisor's word once it had every rank's, else
    the earliest stacks file the agents wrote after the fault."""
    if sup is not None and sup.stacks is not None:
        return sup.stacks.at
    taken = [at for at in run.stacks_at if at >= fault_at]
    return min(taken) if taken else None


def _stopped_alone(ranks: Sequence[Sequence[Process]], fault_at: float) -> bool:
    """Whether every process running at the fault stopped by itself: its last event before
    the fault (the fault killed it) or ``peer-lost`` (it ended on another's death)."""
    for procs in ranks:
        live = [p for p in procs if p.started <= fault_at]
        if live and live[-1].end > fault_at and live[-1].last_event != "peer-lost":
            return False
    return True


def _stall(
    stopped: Sequence[float | None], not_ours: str | None
) -> tuple[float | None, str | None]:
    """When every process of the job had stopped after the fault; else None and why not."""
    if not_ours:
        return None, not_ours
    if not stopped or any(t is None for t in stopped):
        return None, "the job's processes ran on to the end of the job (none was stopped)"
    return max(t for t in stopped if t is not None), None


def incident_phases(
    incident: Incident,
    run: RunRecord,
    processes: Sequence[Process],
    ranks: Sequence[Sequence[Process]] = (),
) -> IncidentPhases:
    """The phases of ``incident`` in ``run`` whose job ran as ``processes`` (process 0's
    runs); ``ranks``: every process's runs, by rank (default: process 0's alone)."""
    fault_at, source = _fault_time(incident, run)
    why: dict[str, str] = {}
    decided_phase = incident.first(PhaseName.decided) or incident.first(PhaseName.received)
    decided = decided_phase.at if decided_phase else incident.opened
    sup = _supervised(incident, run, fault_at)
    # Who acted first: the job's supervisor on a stall it handles, else the coordinator.
    noticed = sup.noticed.at if sup is not None else decided
    stacks = _stacks_at(run, sup, fault_at)
    if stacks is None:
        why["diagnose"] = (
            "no stacks were taken (not a stall)"
            if incident.fault not in PROGRESS_FAULTS
            else "no stacks were kept for this stall"
        )
    elif stacks < noticed:
        why["diagnose"] = (
            f"the agents took the stacks ({stacks - fault_at:+.2f} s) before the decision, "
            "as they saw the stall"
        )
    out = incident.first(PhaseName.node_down, PhaseName.node_drained)
    node_out = out.at if out else None
    if node_out is None:
        why["take_out"] = f"verdict {incident.verdict} keeps {incident.node} in service"
    requeued = incident.first(PhaseName.jobs_requeued)
    running = incident.first(PhaseName.job_running)
    spare, spare_at, no_spare = _spare(incident)
    if no_spare is not None:
        why["replacement"] = no_spare
    not_ours = None if _affects_job(incident, run) else f"no job of this run was on {incident.node}"
    r = _restart(processes, fault_at, not_ours)
    why.update(r.why)
    succ = r.process
    ended = sup.ended.at if sup is not None and sup.ended is not None else None
    stopped = _stopped(ranks or (processes,), fault_at, ended)
    all_stopped, no_stall = _stall(stopped, not_ours)
    if no_stall is not None:
        why["stall"] = no_stall
    started = succ.started if succ else None
    # Slurm running the job again as the coordinator saw it on a tick (else the requeue it
    # saw); never later than the process itself starting, which the tick may lag.
    requeue_end = running.at if running else (requeued.at if requeued else None)
    if requeue_end is not None and started is not None:
        requeue_end = min(requeue_end, started)
    if requeue_end is None and succ is not None:
        why["requeue_wait"] = (
            "the job recovered inside its allocation (relaunched by its supervisor, never requeued)"
            if incident.first(PhaseName.in_allocation)
            else "the journal recorded neither jobs-requeued nor job-running"
        )
    take_start = node_out if node_out is not None else decided
    # The job runs again only after both: the node out and every process stopped. The stall
    # leads the chain only when the processes stopped by themselves (killed by the fault, or
    # ended on losing a peer); one ended by Slurm (a requeue, a node failure) stopped because
    # of the chain, not before it.
    by_stall = all_stopped is not None and (
        ended is not None  # its supervisor stopped it and relaunched it, no node taken out
        or (all_stopped > take_start and _stopped_alone(ranks or (processes,), fault_at))
    )
    gate = all_stopped if by_stall and all_stopped is not None else take_start
    restored = succ.restored_at if succ else None
    first = succ.first_step_start if succ else None
    marks = {
        "fault": fault_at,
        "noticed": noticed,
        "decided": decided,
        "stacks": stacks,
        "node_out": node_out,
        "all_stopped": all_stopped,
        "requeued": requeued.at if requeued else None,
        "job_running": requeue_end,
        "spare_ready": spare_at,
        "last_step_before": r.last_before,
        "started": started,
        "restored": restored,
        "first_step": first,
        "caught_up": r.caught_up,
        "progress": r.progress,
    }
    phases: dict[str, float | None] = {
        "detection": span(fault_at, noticed),
        "diagnose": span(noticed, stacks) if "diagnose" not in why else None,
        "stall": span(fault_at, all_stopped),
        "take_out": span(decided, node_out),
        "requeue_wait": span(gate, requeue_end) if succ is not None else None,
        "replacement": span(fault_at, spare_at),
        "job_restart": span(requeue_end if requeue_end is not None else gate, started),
        "restore": span(started, restored),
        "warmup": span(restored if restored is not None else started, first),
        "recompute": span(first, r.caught_up),
        "no_progress": span(r.last_before if r.last_before is not None else fault_at, r.progress),
    }
    return IncidentPhases(
        phases=phases,
        why={k: v for k, v in why.items() if phases.get(k) is None},
        marks={k: v for k, v in marks.items() if v is not None},
        fault_at=fault_at,
        fault_source=source,
        restored_step=succ.restored_step if succ else None,
        high_water_step=r.high,
        steps_recomputed=r.recomputed if succ else None,
        fallbacks=succ.fallbacks if succ else (),
        spare=spare,
        successor=succ.index if succ else None,
        chain=(("stall",) if by_stall else ("detection", "take_out"))
        + (() if ended is not None else ("requeue_wait",))
        + ("job_restart", "restore", "warmup"),
        stopped=stopped,
        supervised=sup is not None,
    )
