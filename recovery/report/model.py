"""The report as values: what ``report.json`` holds and ``report.md``, the table and the
timeline are drawn from. Times are wall seconds (Unix), durations seconds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from recovery.report.goodput import Goodput
from recovery.report.processes import Fallback, Process
from recovery.report.restarts import Restart
from recovery.report.run import INCIDENTS_FILE, Fault, Job, PhaseMark
from recovery.report.slowdown import Slowdown


@dataclass(frozen=True)
class ActionLine:
    """One action the coordinator took, as the runbook shows it."""

    kind: str
    node: str
    status: str
    detail: str
    slurm_reason: str | None
    """The reason Slurm shows for a take-down or drain (with the ``recover:`` owner mark)."""
    at: float | None
    """When it finished (or was planned, if it never finished)."""


@dataclass(frozen=True)
class IncidentReport:
    id: str
    node: str
    fault: str
    verdict: str
    status: str
    fault_at: float
    fault_source: str
    step_at_fault: int | None
    """The last step the job had finished when the fault happened."""
    interrupted: str
    """How the process running at the fault ended, in words (empty when none was)."""
    recovery_s: float | None
    """Fault to the first update of the restarted process beginning: the sum of the phases
    named in ``chain``."""
    phases: dict[str, float | None]
    """Seconds for each of :data:`recovery.report.phases.PHASES`; None when it did not
    happen (see ``why``)."""
    why: dict[str, str]
    marks: dict[str, float]
    steps_recomputed: int | None
    restored_step: int | None
    high_water_step: int | None
    fallbacks: tuple[Fallback, ...]
    spare: str | None
    decision: str
    """The coordinator's reason for its verdict."""
    path: str
    """How the job was moved (``info.path`` in the journal)."""
    actions: tuple[ActionLine, ...]
    journal: tuple[PhaseMark, ...]
    """Every phase the coordinator recorded, in time order."""
    node_left: str
    """How the failed node was left: ``DOWN``, ``DRAIN``, ``returned to the spare pool``,
    ``in service``."""
    taken_out_as: str | None
    """``DOWN`` or ``DRAIN``: how the coordinator took the node out; None if it did not."""
    slurm_reason: str | None
    """The reason it set on the node in Slurm."""
    returned_to_pool: bool
    successor_index: int | None
    """Index in :attr:`Report.processes` of the process that restarted after the fault."""
    notes: tuple[str, ...]
    """What the phases alone do not tell (an empty spare pool, actions held)."""
    chain: tuple[str, ...] = ()
    """The phases that add up to ``recovery_s`` (``stall`` or ``detection`` and
    ``take_out``, then ``requeue_wait`` to ``warmup``)."""
    stopped: tuple[float | None, ...] = ()
    """Per rank: when its process running at the fault stopped (wall seconds; None: not
    running at the fault, or it ran on to completion)."""
    supervised: bool = False
    """The job's in-allocation supervisor noticed the stall and relaunched the job; the
    ``noticed``, ``stacks`` and ``all_stopped`` marks come from its journal."""
    supervisor: tuple[tuple[float, str, str], ...] = ()
    """What the supervisor journaled from the stall to the relaunch: ``(at, event,
    detail)``."""
    check_wait_s: float | None = None
    """How long the promotion waited for its spares' checks (policy
    ``validation.required``: ``spare-checking`` -> ``spare-promoted``); None when it did
    not wait."""
    spare_checks: tuple[dict[str, Any], ...] = ()
    """Every check of a spare the promotion waited on (the incident's ``spare_checks``), then
    those the job's in-allocation supervisor made on the way to its relaunch."""
    relaunch_check_wait_s: float | None = None
    """How long the in-allocation supervisor's relaunch waited for its spares' checks (and
    for holding out one that failed); None when it checked none on the way."""

    @property
    def ran_on(self) -> bool:
        """The job trained on through the fault: no process of it stopped and none started
        after it (an incident that only reports, such as a slow node left in)."""
        return (
            self.successor_index is None
            and bool(self.stopped)
            and all(t is None for t in self.stopped)
        )


@dataclass(frozen=True)
class Report:
    directory: str
    scenario: str
    started: float
    finished: float
    job: Job
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    incidents: tuple[IncidentReport, ...]
    unmatched_faults: tuple[Fault, ...]
    """Injected faults no incident was opened for (not detected, or ignored)."""
    goodput: Goodput
    processes: tuple[Process, ...]
    completed: bool
    final_step: int | None
    control_digest: str | None
    final_digest: str | None
    digest_match: bool | None
    """Whether the final state equals the uninterrupted control run's (None: unknown)."""
    notes: tuple[str, ...]
    ranks: tuple[tuple[Process, ...], ...] = ()
    """Every training process's runs, by rank (rank 0's are ``processes``); one entry for a
    one-process job."""
    restarts: tuple[Restart, ...] = ()
    """Every run of the job after its first (process 0's), measured from its events alone."""
    steps_recomputed: int = 0
    """Steps done again over the whole run: the restarts' summed (what a scenario's
    ``max_steps_recomputed`` counts)."""
    missing: tuple[str, ...] = ()
    """The scenario runner's files the run directory lacks (a run started by hand)."""
    unknown: tuple[str, ...] = ()
    """What this report cannot tell for lack of those files, one sentence each."""
    slowdowns: tuple[Slowdown, ...] = ()
    """Every slow node of the run and what it cost, before and after the swap."""

    @property
    def journal_known(self) -> bool:
        """Whether the coordinator's journal (``incidents.json``) was there: without it no
        incident is known, which is not the same as none having happened."""
        return INCIDENTS_FILE not in self.missing

    @property
    def wall_s(self) -> float:
        return self.finished - self.started

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (``report.json``); processes without their per-step lists."""
        doc = dataclasses.asdict(self)
        doc["wall_s"] = self.wall_s
        doc["processes"] = [_process_json(p) for p in self.processes]
        doc["ranks"] = [[_process_json(p) for p in procs] for procs in self.ranks]
        return doc


def _process_json(p: Process) -> dict[str, Any]:
    return {
        "index": p.index,
        "node": p.node,
        "restart_count": p.restart_count,
        "started": p.started,
        "end": p.end,
        "outcome": p.outcome,
        "restored_step": p.restored_step,
        "restore_s": p.restore_s,
        "fallbacks": [dataclasses.asdict(f) for f in p.fallbacks],
        "first_step": p.steps[0].step if p.steps else None,
        "last_step": p.steps[-1].step if p.steps else None,
        "updates": len(p.steps),
        "checkpoints": [c.step for c in p.checkpoints],
    }
