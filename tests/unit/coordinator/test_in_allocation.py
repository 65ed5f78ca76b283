"""The coordinator's record of a fault a job absorbed inside its allocation (issue 16): a
``--no-kill`` job Slurm dropped the DOWN node from runs on, never requeued; the incident gets
``in-allocation`` and counts the job as resolved. The pool spare is still promoted (a refill
of the cluster, not of the job): that path is unchanged and tested in test_engine.py."""

from __future__ import annotations

from recovery.coordinator.reconcile import follow_jobs
from recovery.ports.clock import Stamp
from recovery.ports.journal import IncidentInfo, IncidentRecord, IncidentStatus, PhaseName
from recovery.ports.slurm import JobInfo


def _incident(*jobs: str) -> IncidentRecord:
    return IncidentRecord(
        id="i1",
        node="n3",
        fault="xid79",
        verdict="replace",
        status=IncidentStatus.open,
        opened=Stamp(1.0, 1.0),
        jobs=jobs,
        info=IncidentInfo(job_restarts=dict.fromkeys(jobs, 0)),
    )


def test_a_job_running_on_without_the_node_is_recovered_in_its_allocation() -> None:
    job = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n2"))
    progress = follow_jobs(_incident("7"), {"7": job})
    assert progress.phases == ((PhaseName.in_allocation, "7@n1,n2"),)
    assert progress.resolved


def test_a_job_still_holding_the_node_is_not_in_allocation() -> None:
    job = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n3"))
    progress = follow_jobs(_incident("7"), {"7": job})
    assert progress.phases == ()
    assert not progress.resolved


def test_a_requeued_job_is_followed_as_before() -> None:
    job = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n2"), restart_count=1)
    progress = follow_jobs(_incident("7"), {"7": job})
    assert [name for name, _ in progress.phases] == [PhaseName.jobs_requeued, PhaseName.job_running]


def test_a_job_that_lost_its_batch_host_is_not_recovered_in_its_allocation() -> None:
    """Its batch script (the supervisor) died with the node: it is not recovering, it is
    headless; unresolved until the coordinator requeues it (test_ended_jobs.py)."""
    job = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n2"), batch_host="n3")
    progress = follow_jobs(_incident("7"), {"7": job})
    assert progress.phases == ()
    assert not progress.resolved
    elsewhere = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n2"), batch_host="n1")
    assert follow_jobs(_incident("7"), {"7": elsewhere}).resolved


def test_a_job_left_to_its_supervisor_is_in_allocation_on_the_same_nodes() -> None:
    """A hang the job's supervisor relaunches itself (recovery/inalloc/hang.py): the job keeps
    the node and its restart count."""
    incident = _incident("7")
    incident = IncidentRecord(**{**incident.__dict__, "info": IncidentInfo(
        job_restarts={"7": 0}, supervised=["7"])})  # fmt: skip
    job = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n3"))
    progress = follow_jobs(incident, {"7": job})
    assert progress.phases == ((PhaseName.in_allocation, "7@n1,n3"),)
    assert progress.resolved
    # Requeued after all (its supervisor's budget spent): followed as any requeued job.
    again = JobInfo("7", "recover-train", "RUNNING", nodes=("n1", "n3"), restart_count=1)
    assert [n for n, _ in follow_jobs(incident, {"7": again}).phases] == [
        PhaseName.jobs_requeued, PhaseName.job_running,
    ]  # fmt: skip
