"""What the node agents keep beside a job's progress records for whoever acts on it: a
stalled job's stacks, one text file per process, ``<progress dir>/stacks/rank<r>.txt``, whose
first line names the process and ends with ``at <Unix seconds>``, when they were taken; and a
slow process's report, ``<progress dir>/slow/rank<r>.txt`` (the same first line). The agents
write them (they can read a process's stacks on their own node, and they report to the
coordinator); the job's supervisor waits for them before it ends a launch, so that the
diagnosis and the incident come first, and the report marks when the stacks were taken.

A job's in-allocation supervisor also leaves ``<progress dir>/supervised`` while it watches:
the agents then leave moving the job off a slow node to it (it relaunches on a spare of its
own) and only report the node."""

from __future__ import annotations

from pathlib import Path

from recovery.progress.record import Record

#: The folders under the progress directory.
STACKS = "stacks"
SLOW = "slow"
SUPERVISED = "supervised"
#: Stacks taken this long before a stall was judged are still its own: each agent judges the
#: job on its own, about once a second, so theirs come within a second or two of each other.
SAME_STALL_S = 10.0


def stacks_path(directory: Path, rank: int) -> Path:
    """Process ``rank``'s stacks file under the progress ``directory``."""
    return directory / STACKS / f"rank{rank}.txt"


def write_stacks(directory: Path, rec: Record, text: str, at: float) -> Path:
    """Keep ``text`` (the stacks of ``rec``'s process, taken at ``at``) beside the records.

    Raises OSError when the folder cannot be written."""
    path = stacks_path(directory, rec.rank)
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        f"rank {rec.rank} pid {rec.pid} on {rec.node}, step {rec.step_finished}, "
        f"phase {rec.phase.name}, at {at:.3f}\n{text}\n"
    )
    return path


def taken_at(path: Path) -> float | None:
    """When the stacks in ``path`` were taken; None when it is missing or not such a file."""
    try:
        with path.open(errors="replace") as f:
            head = f.readline()
        return float(head.rsplit(" at ", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def fresh(directory: Path, rank: int, since: float) -> bool:
    """Process ``rank``'s stacks were taken for the stall judged at ``since`` (at most
    :data:`SAME_STALL_S` before it)."""
    at = taken_at(stacks_path(directory, rank))
    return at is not None and at >= since - SAME_STALL_S


def missing(directory: Path, ranks: list[int], since: float) -> list[int]:
    """Of ``ranks``, those with no stacks taken for the stall judged at ``since``."""
    return [r for r in ranks if not fresh(directory, r, since)]


def write_slow_report(directory: Path, rec: Record, text: str, at: float) -> Path:
    """Keep the agent's report of ``rec``'s process as the job's straggler (OSError when the
    folder cannot be written)."""
    path = directory / SLOW / f"rank{rec.rank}.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"rank {rec.rank} pid {rec.pid} on {rec.node}, at {at:.3f}\n{text}\n")
    return path


def slow_reported(directory: Path, rank: int, since: float) -> bool:
    """An agent reported process ``rank`` slow at ``since`` or later."""
    at = taken_at(directory / SLOW / f"rank{rank}.txt")
    return at is not None and at >= since


def mark_supervised(directory: Path, who: str) -> Path:
    """Say that a supervisor (``who``: its host and pid) watches the job in ``directory``.
    Raises OSError when it cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SUPERVISED
    path.write_text(who + "\n")
    return path


def unmark_supervised(directory: Path) -> None:
    """The supervisor is done with the job (nothing to do when it was not marked)."""
    (directory / SUPERVISED).unlink(missing_ok=True)


def supervised(directory: Path) -> bool:
    """A supervisor watches the job in ``directory`` (:func:`mark_supervised`)."""
    return (directory / SUPERVISED).exists()
