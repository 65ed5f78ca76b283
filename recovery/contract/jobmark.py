"""The mark ``recover sbatch`` leaves on the jobs it submits, in Slurm's comment field
(``--comment``), and what the coordinator reads from it.

``recover:train`` marks a training job of ours, whatever its name (``--job-name`` changes the
name, never the mark); ``recover:train,in-allocation`` one that carries spares of its own and
runs ``recover supervise-job`` in its batch step. That supervisor watches the launch's
progress itself (:mod:`recovery.inalloc.hang`) and relaunches a hung one inside the
allocation, so the coordinator leaves such a job to it on a fault of :data:`PROGRESS_FAULTS`
(requeueing it would throw the allocation away). A job a user gave a ``--comment`` of their
own carries theirs, not the mark: sbatch options given by hand win.
"""

from __future__ import annotations

PREFIX = "recover:"
TRAIN = "recover:train"
IN_ALLOCATION = "in-allocation"
#: The faults the node agents report from the jobs' progress records (agents/progress.py).
PROGRESS_FAULTS = frozenset({"rank-hang", "rank-frozen", "job-hang"})


def job_comment(*, in_allocation: bool) -> str:
    """The comment ``recover sbatch`` gives a training job."""
    return f"{TRAIN},{IN_ALLOCATION}" if in_allocation else TRAIN


def _words(comment: str) -> list[str]:
    return comment.strip().split(",") if comment.strip().startswith(PREFIX) else []


def is_ours(comment: str) -> bool:
    """The job was submitted by ``recover sbatch`` (whatever its name)."""
    return bool(_words(comment)) and _words(comment)[0] == TRAIN


def in_allocation(comment: str) -> bool:
    """The job recovers inside its allocation: its supervisor relaunches it."""
    return is_ours(comment) and IN_ALLOCATION in _words(comment)[1:]


def left_to_supervisor(comment: str, fault: str) -> bool:
    """The coordinator leaves the job alone on ``fault``: its own supervisor sees it and
    relaunches the training inside the allocation."""
    return fault in PROGRESS_FAULTS and in_allocation(comment)
