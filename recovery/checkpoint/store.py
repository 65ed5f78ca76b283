"""Durable, verifiable checkpoints of a flat mapping ``leaf path -> numpy array``.

:class:`CheckpointStore` is the facade over three modules of one idea each:

* :mod:`recovery.checkpoint.scan` - which steps exist, their status, leftovers;
* :mod:`recovery.checkpoint.verify` - manifest checks, re-reading and hashing every byte,
  restoring the newest step that verifies;
* :mod:`recovery.checkpoint.commit` - the save protocol: every byte durable before the step
  directory gets its name, and the name durable before anything older is deleted.

This module knows nothing about JAX; :mod:`recovery.checkpoint.tree` converts pytrees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from recovery.checkpoint import commit, scan, shared, verify
from recovery.checkpoint import format as fmt
from recovery.checkpoint.commit import SaveResult
from recovery.checkpoint.retention import RetentionPolicy
from recovery.checkpoint.scan import StepState, StepStatus
from recovery.checkpoint.shared import Peers
from recovery.checkpoint.verify import Loaded, RestoreResult

__all__ = [
    "CheckpointStore",
    "Clock",
    "Loaded",
    "Peers",
    "RestoreResult",
    "SaveResult",
    "StepState",
    "StepStatus",
]

Clock = Callable[[], float]


class CheckpointStore:
    """Checkpoints of one run, one directory per step under ``root``.

    Args:
        root: the checkpoint root (created on the first save).
        clock: wall clock in seconds, for manifest timestamps and ages.
        workers: threads that write or read data files in parallel; a save makes at most
            this many files. Most of a save is spent in ``fsync``, which blocks without
            using a CPU; many fsyncs in flight keep the disk's queue full and let the file
            system commit them in one journal transaction, so this is well above the core
            count (``benchmarks/README.md`` has the measurements behind 16).
        retention: what to keep after each durable save; None keeps everything.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        clock: Clock = time.time,
        workers: int = 16,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self.root = Path(root)
        self._clock = clock
        self._workers = max(1, workers)
        self.retention = retention

    # --- listing ---------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Committed step numbers (directories named ``step_N``), ascending. Unverified."""
        return scan.committed_steps(self.root)

    def step_path(self, step: int) -> Path:
        return scan.step_path(self.root, step)

    def scan(self, *, deep: bool = True) -> list[StepStatus]:
        """Status of every committed step and every leftover, newest step first.

        ``deep`` re-reads and hashes every file; without it only the manifest and file sizes
        are checked (fast, but a flipped byte goes unnoticed).
        """
        return scan.scan(self.root, deep=deep, now=self._clock(), workers=self._workers)

    # --- verification and loading ------------------------------------------------------------

    def verify(self, step: int, *, run_config: Mapping[str, Any] | None = None) -> fmt.Manifest:
        """Fully verify one step (every byte re-read and hashed).

        Raises:
            CheckpointDamaged: the step fails a check; ``reason`` says which.
            ConfigMismatchError: ``run_config`` is given and differs from the saved one.
        """
        return self.load(step, run_config=run_config).manifest

    def load(self, step: int, *, run_config: Mapping[str, Any] | None = None) -> Loaded:
        """Read and verify one step; arrays come back in host memory.

        Raises:
            CheckpointDamaged, ConfigMismatchError: as for :meth:`verify`.
        """
        return verify.load(self.root, step, run_config=run_config, workers=self._workers)

    def restore_latest(self, *, run_config: Mapping[str, Any]) -> RestoreResult:
        """Load the newest step that verifies, skipping (and reporting) damaged newer ones.

        Raises:
            NoCheckpointError: there is no checkpoint at all.
            AllCheckpointsDamagedError: every checkpoint failed; each reason is listed.
            ConfigMismatchError: the newest well-formed checkpoint belongs to a differently
                configured run - falling back would silently continue some other run.
        """
        return verify.restore_latest(
            self.root, self.steps(), run_config=run_config, workers=self._workers
        )

    def restore_agreed(self, *, peers: Peers, run_config: Mapping[str, Any]) -> RestoreResult:
        """:meth:`restore_latest` for a job of several processes: the newest step that every
        process verifies (:func:`recovery.checkpoint.shared.restore_agreed`; a collective).

        Raises:
            NoCheckpointError, ConfigMismatchError: as :meth:`restore_latest`.
            NoAgreedCheckpointError: no step verifies for all; each refusal is listed.
            PeerLostError: a process was lost on the way.
        """
        return shared.restore_agreed(
            self.root, peers=peers, run_config=run_config, workers=self._workers
        )

    # --- writing -----------------------------------------------------------------------------

    def save(
        self,
        step: int,
        arrays: Mapping[str, np.ndarray],
        *,
        run_config: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
        key_impls: Mapping[str, str] | None = None,
    ) -> SaveResult:
        """Durably save ``arrays`` as checkpoint ``step``, then apply retention.

        Input is checked before anything is written. An existing ``step_N`` (for instance a
        damaged one) is replaced only once the new one is complete. The order of operations
        is :mod:`recovery.checkpoint.commit`'s. ``key_impls`` maps the leaves that hold JAX
        PRNG keys' data to their key implementation, recorded in the manifest.

        Raises:
            UsageError: negative step, a leaf whose dtype cannot be stored (objects, strings,
                structured), a run configuration / metadata that is not plain JSON, or a
                key implementation for a path that is no leaf.
            OSError: I/O failure; a ``.tmp-`` leftover remains for :meth:`remove_leftovers`
                and committed checkpoints are untouched.
        """
        metadata = dict(metadata or {})
        items = commit.checked_input(step, arrays, run_config, metadata, key_impls)
        t0 = time.perf_counter()
        commit.make_root(self.root)
        final = self.step_path(step)
        tmp = commit.new_tmp_dir(self.root, final)
        leaves, files = commit.write_data(tmp, items, workers=self._workers, key_impls=key_impls)
        manifest = fmt.build_manifest(
            step=step,
            created_unix=self._clock(),
            run_config=run_config,
            metadata=metadata,
            files=files,
            leaves=leaves,
        )
        commit.write_manifest(tmp, manifest)
        commit.publish(self.root, tmp, final)
        deleted, errors = self.apply_retention(newest_durable=step)
        return SaveResult(
            step=step,
            path=final,
            total_bytes=sum(leaf.nbytes for leaf in leaves),
            seconds=time.perf_counter() - t0,
            state_digest=fmt.state_digest(leaves),
            deleted_steps=tuple(deleted),
            retention_errors=tuple(errors),
        )

    def save_shared(
        self,
        step: int,
        arrays: Mapping[str, np.ndarray],
        *,
        peers: Peers,
        save_index: int,
        run_config: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
        key_impls: Mapping[str, str] | None = None,
    ) -> SaveResult:
        """:meth:`save` by every process of a job at once, each writing its share of the data
        files; process 0 commits once every share is durable
        (:func:`recovery.checkpoint.shared.save_shared`; a collective).

        Raises:
            UsageError: as :meth:`save`.
            SharedSaveError: a process's part or the commit failed (named in the message).
            PeerLostError: a process was lost on the way.
        """
        return shared.save_shared(
            self.root,
            step,
            arrays,
            peers=peers,
            save_index=save_index,
            run_config=run_config,
            metadata=dict(metadata or {}),
            retention=self.retention,
            workers=self._workers,
            now=self._clock(),
            key_impls=key_impls,
        )

    def apply_retention(self, *, newest_durable: int) -> tuple[list[int], list[str]]:
        """Delete what the retention policy no longer keeps.

        Only steps older than ``newest_durable`` (a save that is already on stable storage)
        are candidates, so a newer checkpoint is always durable before an older one goes.
        A deletion that fails is reported, not raised: the checkpoints are intact either way
        and the next call tries again.

        Returns:
            ``(deleted steps, one message per failed deletion)``.
        """
        return commit.apply_retention(self.root, self.retention, newest_durable=newest_durable)

    def set_aside(self, step: int) -> Path:
        """Move a damaged step out of the way (kept for inspection, never deleted by us)."""
        return commit.set_aside(self.root, step, now=self._clock())

    def remove_leftovers(self) -> list[str]:
        """Delete temporary directories of interrupted saves and deletions.

        Call only while holding :class:`RunLock`: a live writer's temporary directory looks
        exactly like a leftover.
        """
        return commit.remove_leftovers(self.root)
