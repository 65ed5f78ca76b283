"""Slurm as a source of truth: what the coordinator learns by looking, on every tick.

* A node Slurm holds DOWN that no agent reported and that nobody marked (a crashed slurmd, a
  node that lost power) becomes a ``node-unreachable`` event - a failure no agent can report.
* The jobs that ran on an incident's node are followed: requeued (``jobs-requeued``), running
  again (``job-running``, on which nodes), or finished.
* An incident whose actions are all settled and whose jobs run again (or ended) is closed.

Pure functions over snapshots (nodes, jobs, incidents); the engine applies what they return.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from recovery.model import HealthEvent, Source
from recovery.model.events import UNREACHABLE
from recovery.ports.journal import ActionStatus, IncidentRecord
from recovery.ports.slurm import JobInfo, NodeInfo, is_slurms_own

#: Actions in these states still have work to do; an incident with any stays open.
UNSETTLED = frozenset({ActionStatus.planned, ActionStatus.waiting, ActionStatus.held})


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

    phases: tuple[tuple[str, str], ...]
    resolved: bool


def follow_jobs(incident: IncidentRecord, jobs: Sequence[JobInfo]) -> JobProgress:
    """Phases the incident's jobs reached, from one ``squeue`` snapshot.

    ``jobs-requeued`` once a job is pending again or its restart count rose; ``job-running``
    once every job that is still known runs again after a restart. Jobs Slurm forgot or that
    finished count as resolved.
    """
    by_id = {j.job_id: j for j in jobs}
    initial: dict[str, int] = incident.info.get("job_restarts", {})
    have = {p.name for p in incident.phases}
    phases: list[tuple[str, str]] = []
    requeued: list[str] = []
    running: list[str] = []
    unresolved = 0
    for job_id in incident.jobs:
        job = by_id.get(job_id)
        if job is None or (job.finished and job.state != "PENDING"):
            continue
        restarted = job.restart_count > int(initial.get(job_id, 0))
        if restarted or job.state == "PENDING":
            requeued.append(job_id)
        if restarted and job.state == "RUNNING":
            running.append(f"{job_id}@{','.join(job.nodes)}")
        else:
            unresolved += 1
    if requeued and "jobs-requeued" not in have:
        phases.append(("jobs-requeued", " ".join(requeued)))
    if running and not unresolved and "job-running" not in have:
        phases.append(("job-running", " ".join(running)))
    return JobProgress(tuple(phases), resolved=unresolved == 0)


def settled(incident: IncidentRecord) -> bool:
    """Every action of the incident reached an end state."""
    return all(a.status not in UNSETTLED for a in incident.actions)
