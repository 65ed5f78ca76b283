"""What a checkpoint root holds: committed steps, their status, and leftovers.

Only names are trusted here for listing (``step_N`` is committed, ``.tmp-``/``.trash-`` are
leftovers, ``.damaged-`` was set aside); :func:`scan` asks :mod:`recovery.checkpoint.verify`
about each step's content.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from recovery.checkpoint import format as fmt
from recovery.checkpoint import verify
from recovery.errors import CheckpointDamaged

StepState = Literal["intact", "incomplete", "corrupt"]


@dataclass(frozen=True)
class StepStatus:
    """What ``recover checkpoint ls`` shows for one directory entry."""

    name: str
    step: int | None
    state: StepState
    reason: str
    size_bytes: int
    age_s: float


def committed_steps(root: Path) -> list[int]:
    """Step numbers of the directories named ``step_N`` under ``root``, ascending.

    Unverified; an absent root holds none.
    """
    if not root.is_dir():
        return []
    found = (fmt.parse_step_dir(p.name) for p in root.iterdir() if p.is_dir())
    return sorted(s for s in found if s is not None)


def step_path(root: Path, step: int) -> Path:
    return root / fmt.step_dir_name(step)


def leftovers(root: Path) -> list[Path]:
    """Temporary directories of interrupted saves and deletions, sorted by name."""
    if not root.is_dir():
        return []
    prefixes = (fmt.TMP_PREFIX, fmt.TRASH_PREFIX)
    return sorted(p for p in root.iterdir() if p.name.startswith(prefixes))


def scan(root: Path, *, deep: bool, now: float, workers: int) -> list[StepStatus]:
    """Status of every committed step, newest first, then of every leftover and set-aside step.

    ``deep`` re-reads and hashes every file (with up to ``workers`` threads); without it only
    the manifest and file sizes are checked. ``now`` is the wall clock in seconds, for ages.
    """
    out = [
        _step_status(root, step, deep=deep, now=now, workers=workers)
        for step in reversed(committed_steps(root))
    ]
    others = sorted(root.iterdir()) if root.is_dir() else []
    out.extend(s for s in (_other_status(p, now) for p in others) if s is not None)
    return out


def _step_status(root: Path, step: int, *, deep: bool, now: float, workers: int) -> StepStatus:
    path = step_path(root, step)
    size = _du(path)
    try:
        manifest = verify.check(root, step, read=deep, workers=workers)
    except CheckpointDamaged as e:
        missing = e.reason.startswith(fmt.MANIFEST + " missing")
        state: StepState = "incomplete" if missing else "corrupt"
        return StepStatus(path.name, step, state, e.reason, size, now - _mtime(path))
    return StepStatus(path.name, step, "intact", "", size, now - manifest.created_unix)


def _other_status(p: Path, now: float) -> StepStatus | None:
    """A leftover or a set-aside step; None for anything else in the root."""
    if p.name.startswith(fmt.TMP_PREFIX):
        state: StepState = "incomplete"
        why = "interrupted save (removed by the next training run)"
    elif p.name.startswith(fmt.TRASH_PREFIX):
        state, why = "incomplete", "interrupted deletion (removed by the next training run)"
    elif p.name.startswith(fmt.DAMAGED_PREFIX):
        state, why = "corrupt", "set aside after failing verification during a restore"
    else:
        return None
    return StepStatus(p.name, None, state, why, _du(p), now - _mtime(p))


def _du(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
