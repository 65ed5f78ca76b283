"""Checkpoints of a job of several processes that each hold the whole (replicated) state.

**Save** (every process calls :func:`save_shared` with the same step and state): the leaves
are planned into at least one data file per process, the same plan everywhere; process ``r``
writes data files ``r, r + K, r + 2K, ...`` into one temporary directory they share, and
fsyncs each. Each process then reports what it wrote (offsets and digests, or its error) to
all; process 0 alone writes the manifest, renames the directory to ``step_N`` and applies
retention, exactly as a single process does, and reports the outcome to all. So ``step_N``
exists only once every process's part is durable, and there is one manifest per step.

**Restore** (:func:`restore_agreed`): every process reads and verifies every byte of a
candidate step itself; the processes exchange their verdicts and take the newest step that
verifies for all of them, with the same state digest. If there is none, the error names
each step and why each process refused it.

A process lost mid-save leaves a ``.tmp-`` directory and no ``step_N`` (the next run removes
it); a process lost mid-restore makes the others stop before they exchange verdicts. The
collectives come from ``peers`` (a :class:`Peers`), so this module knows nothing of how the
processes talk.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from recovery.checkpoint import commit, verify
from recovery.checkpoint import files as io
from recovery.checkpoint import format as fmt
from recovery.checkpoint.commit import SaveResult
from recovery.checkpoint.retention import RetentionPolicy
from recovery.checkpoint.scan import committed_steps
from recovery.checkpoint.verify import Loaded, RestoreResult
from recovery.errors import (
    CheckpointDamaged,
    CheckpointError,
    ConfigMismatchError,
    NoAgreedCheckpointError,
    NoCheckpointError,
)


class Peers(Protocol):
    """The collectives a shared save or restore needs (``recovery.multiproc.Group.channel``
    provides them)."""

    rank: int
    size: int
    session: str
    """The same string on every process of this launch."""

    def allgather(self, value: Any) -> list[Any]:
        """Every process's (plain JSON) ``value``, in rank order; raises if a peer is lost."""
        ...


class SharedSaveError(CheckpointError):
    """A process could not write its part of a shared save, or process 0 could not commit."""


def save_shared(
    root: Path,
    step: int,
    arrays: Mapping[str, np.ndarray],
    *,
    peers: Peers,
    save_index: int,
    run_config: Mapping[str, Any],
    metadata: Mapping[str, Any],
    retention: RetentionPolicy | None,
    workers: int,
    now: float,
    key_impls: Mapping[str, str] | None = None,
) -> SaveResult:
    """Save ``step`` together with the other processes (see the module docstring).

    ``save_index`` counts this launch's saves (the same on every process), so two saves of
    one step never share a temporary directory. ``key_impls``: as
    :meth:`CheckpointStore.save`.

    Raises:
        UsageError: as :meth:`CheckpointStore.save`, before anything is written.
        SharedSaveError: a process's write failed, or the commit did; every process raises it
            with the same message, naming the process. Leftovers stay for the next run.
        PeerLostError: a process was lost on the way (from ``peers``).
    """
    t0 = time.perf_counter()
    items = commit.checked_input(step, arrays, run_config, metadata, key_impls)
    views = [io.as_bytes(a) for _, a in items]
    plan = io.plan_files(
        [len(v) for v in views], max_files=max(workers, peers.size), min_files=peers.size
    )
    final = root / fmt.step_dir_name(step)
    tmp = root / f"{fmt.TMP_PREFIX}{final.name}-{peers.session}-{save_index}"
    mine = [f for f in range(len(plan)) if f % peers.size == peers.rank]
    part: dict[str, Any]
    try:
        commit.make_root(root)
        tmp.mkdir(exist_ok=True)
        written = commit.write_files(tmp, views, plan, mine, workers=workers)
        part = {"files": [[f, size, placed] for f, (placed, size) in written.items()]}
    except OSError as e:
        part = {"error": f"{type(e).__name__}: {e}"}
    parts = peers.allgather(part)
    failed = [f"process {r}: {p['error']}" for r, p in enumerate(parts) if "error" in p]
    if failed:
        raise SharedSaveError(f"step {step} not saved: " + "; ".join(failed))
    everything: commit.Written = {}
    for p in parts:
        for f, size, placed in p["files"]:
            everything[int(f)] = ([(int(o), str(d)) for o, d in placed], int(size))
    leaves, files = commit.manifest_entries(items, plan, everything, key_impls)
    outcome = peers.allgather(
        _commit(root, tmp, final, step, leaves, files, run_config, metadata, retention, now)
        if peers.rank == 0
        else None
    )[0]
    if "error" in outcome:
        raise SharedSaveError(f"step {step} not committed by process 0: {outcome['error']}")
    return SaveResult(
        step=step,
        path=final,
        total_bytes=sum(leaf.nbytes for leaf in leaves),
        seconds=time.perf_counter() - t0,
        state_digest=fmt.state_digest(leaves),
        deleted_steps=tuple(outcome["deleted"]),
        retention_errors=tuple(outcome["retention_errors"]),
    )


def _commit(
    root: Path,
    tmp: Path,
    final: Path,
    step: int,
    leaves: list[fmt.LeafEntry],
    files: list[fmt.FileEntry],
    run_config: Mapping[str, Any],
    metadata: Mapping[str, Any],
    retention: RetentionPolicy | None,
    now: float,
) -> dict[str, Any]:
    """Process 0's part once every data file is durable: manifest, rename, retention."""
    manifest = fmt.build_manifest(
        step=step,
        created_unix=now,
        run_config=run_config,
        metadata=metadata,
        files=files,
        leaves=leaves,
    )
    try:
        commit.write_manifest(tmp, manifest)
        commit.publish(root, tmp, final)
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    deleted, errors = commit.apply_retention(root, retention, newest_durable=step)
    return {"deleted": deleted, "retention_errors": errors}


def restore_agreed(
    root: Path, *, peers: Peers, run_config: Mapping[str, Any], workers: int
) -> RestoreResult:
    """Load the newest step that every process verifies (see the module docstring).

    ``fallbacks`` lists each newer step refused, with every process's reason.

    Raises:
        NoCheckpointError: no process sees any checkpoint.
        NoAgreedCheckpointError: no step verifies for all; each refusal is listed.
        ConfigMismatchError: the newest well-formed checkpoint belongs to a differently
            configured run (as for a single process).
        PeerLostError: a process was lost on the way (from ``peers``).
    """
    listings = peers.allgather(committed_steps(root))
    candidates = sorted({int(s) for listing in listings for s in listing}, reverse=True)
    if not candidates:
        raise NoCheckpointError(
            f"resume requested but {root} holds no checkpoint "
            "(start without --resume, or point --run-dir at the run to continue)"
        )
    refusals: list[tuple[int, str]] = []
    for step in candidates:
        loaded, verdict, mismatch = _try(root, step, run_config, workers)
        verdicts = peers.allgather(verdict)
        if mismatch is not None:
            raise mismatch
        if any("config" in v for v in verdicts):
            raise CheckpointError(
                f"checkpoint step {step}: " + next(v["config"] for v in verdicts if "config" in v)
            )
        digests = {v.get("ok") for v in verdicts}
        if loaded is not None and digests == {loaded.state_digest}:
            return RestoreResult(loaded, refusals)
        refusals.append((step, _why(verdicts)))
    raise NoAgreedCheckpointError(str(root), refusals)


def _try(
    root: Path, step: int, run_config: Mapping[str, Any], workers: int
) -> tuple[Loaded | None, dict[str, str], ConfigMismatchError | None]:
    """This process's verdict on ``step``: the loaded step, what to tell the others, and a
    configuration mismatch to raise once they have heard it."""
    try:
        loaded = verify.load(root, step, run_config=run_config, workers=workers)
    except CheckpointDamaged as e:
        return None, {"damaged": e.reason}, None
    except ConfigMismatchError as e:
        return None, {"config": str(e)}, e
    return loaded, {"ok": loaded.state_digest}, None


def _why(verdicts: Sequence[dict[str, str]]) -> str:
    damaged = [f"process {r}: {v['damaged']}" for r, v in enumerate(verdicts) if "damaged" in v]
    if damaged:
        return "; ".join(damaged)
    return "the processes read different states: " + ", ".join(
        f"process {r} {v.get('ok')}" for r, v in enumerate(verdicts)
    )
