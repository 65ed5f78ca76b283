"""How ended jobs read: exit status, signal, end time, restart count, the nodes they ran on.

The 22.05 samples are real captures from the local cluster (``squeue --json`` and
slurmrestd's ``GET jobs``, the same shape):

* ``squeue-22.05-ended.json``: job 1's process was killed by SIGABRT under a batch script that
  passes its status on (``ExitCode=134:0``), job 2 exited 93, job 3's batch shell was
  SIGKILLed (``ExitCode=0:9``), job 5 was ``--no-requeue`` on a node set DOWN (NODE_FAIL), and
  job 4, a 2-node job whose second node was set DOWN, is COMPLETING at its new restart count
  with the lost node already gone from its node list.
* ``squeue-22.05-requeued-failed.json``: job 1 after ``scontrol requeue 1``: PENDING at
  restart 1, keeping the exit status of the run that failed.
* ``rest-22.05/jobs-failed.json``: slurmrestd's view of a job like job 1.

``squeue-23.11-ended.json`` is written by hand after the v0.0.40 schema (wrapped numbers, the
exit status as an object with a signal).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm.parse import exit_status, parse_jobs

SAMPLES = Path(__file__).parent / "samples"


def test_squeue_22_05_ended_jobs_real_capture() -> None:
    jobs = {j.job_id: j for j in parse_jobs((SAMPLES / "squeue-22.05-ended.json").read_text())}
    aborted, dnr, killed, completing, node_fail = (jobs[i] for i in ("1", "2", "3", "4", "5"))
    assert (aborted.state, aborted.exit_code, aborted.signal) == ("FAILED", 134, None)
    assert (aborted.end_time, aborted.nodes, aborted.restart_count) == (1796214872.0, ("node1",), 0)
    assert aborted.requeueable
    assert aborted.reason == "NonZeroExitCode"
    assert (dnr.state, dnr.exit_code, dnr.end_time) == ("FAILED", 93, 1796214871.0)
    assert (killed.state, killed.exit_code, killed.signal) == ("FAILED", 0, 9)
    assert (node_fail.state, node_fail.signal, node_fail.requeueable) == ("NODE_FAIL", 15, False)
    assert node_fail.end_time == 1796214905.0
    assert node_fail.nodes == ("node3",)
    # The multi-node job Slurm requeued when node2 went DOWN: COMPLETING at restart 1 on the
    # node it keeps; not finished, so no end time (Slurm's value there is a projection).
    assert (completing.state, completing.restart_count, completing.nodes) == (
        "COMPLETING", 1, ("node1",))  # fmt: skip
    assert not completing.finished
    assert completing.end_time == 0.0


def test_a_requeued_failed_job_is_pending_with_its_old_exit_status() -> None:
    (job,) = parse_jobs((SAMPLES / "squeue-22.05-requeued-failed.json").read_text())
    assert (job.state, job.restart_count, job.nodes) == ("PENDING", 1, ())
    assert job.exit_code == 134  # the run that failed: read it only once the job finished
    assert job.end_time == 0.0  # not finished: Slurm's end_time there is far in the future


def test_slurmrestd_reads_a_failed_job_like_squeue() -> None:
    (job,) = parse_jobs((SAMPLES / "rest-22.05" / "jobs-failed.json").read_text(), "GET jobs")
    assert (job.state, job.exit_code, job.signal, job.nodes) == ("FAILED", 134, None, ("node1",))
    assert job.end_time == 1796215076.0
    assert job.requeueable


def test_squeue_23_11_ended_jobs() -> None:
    jobs = {j.job_id: j for j in parse_jobs((SAMPLES / "squeue-23.11-ended.json").read_text())}
    assert (jobs["21"].state, jobs["21"].exit_code, jobs["21"].signal) == ("FAILED", 134, None)
    assert jobs["21"].end_time == 1796214872.0
    assert (jobs["22"].exit_code, jobs["22"].signal, jobs["22"].restart_count) == (0, 9, 1)
    assert jobs["22"].nodes == ("node2", "node3")
    assert (jobs["23"].state, jobs["23"].requeueable, jobs["23"].signal) == ("NODE_FAIL", False, 15)
    assert (jobs["24"].state, jobs["24"].exit_code, jobs["24"].end_time) == ("RUNNING", None, 0.0)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (0, (0, None)),
        (34304, (134, None)),  # exit 134 (128 + SIGABRT, passed on by a shell)
        (23808, (93, None)),
        (9, (0, 9)),  # killed by SIGKILL
        (15, (0, 15)),
        (134, (0, 6)),  # SIGABRT with a core dump (0x80 set): the signal is the low 7 bits
        (None, (None, None)),
        ({"return_code": {"set": True, "number": 1}}, (1, None)),
        ({"status": ["PENDING"], "return_code": {"set": False, "number": 0}}, (None, None)),
        (
            {
                "return_code": {"set": True, "number": 0},
                "signal": {"id": {"set": True, "number": 6}, "name": "ABRT"},
            },
            (0, 6),
        ),
        ({"return_code": 2, "signal": {"id": {"set": False, "number": 0}}}, (2, None)),
    ],
)
def test_exit_status_in_both_shapes(raw: object, status: tuple[int | None, int | None]) -> None:
    assert exit_status(raw) == status
