"""Durable, verifiable checkpoints of a flat mapping ``leaf path -> numpy array``.

Save protocol (each step survives power loss, not only a killed process):

1. pack the leaves into a few data files in a temporary sibling directory
   ``.tmp-step_N-<id>``, hashing each leaf as it is written (no second read), and ``fsync``
   each file (files are written in parallel: fsync waits, it does not compute);
2. write ``manifest.json`` last and ``fsync`` it, then ``fsync`` the temporary directory;
3. ``rename`` it to ``step_N`` and ``fsync`` the checkpoint root so the rename is durable.

A directory named ``step_N`` therefore always had all of its bytes on stable storage before
it got its name. Restore trusts nothing of that: it re-reads every file and checks sizes,
digests, the manifest's own checksum, the step and the run configuration.

This module knows nothing about JAX; :mod:`recovery.checkpoint.tree` converts pytrees.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recovery.checkpoint import files as io
from recovery.checkpoint import format as fmt
from recovery.checkpoint.retention import RetentionPolicy, steps_to_delete
from recovery.errors import (
    AllCheckpointsDamagedError,
    CheckpointDamaged,
    ConfigMismatchError,
    NoCheckpointError,
    UsageError,
)

_READ_BYTES_PER_THREAD = 16 * 1024 * 1024  # a restore uses one thread per this much

Clock = Callable[[], float]


@dataclass(frozen=True)
class SaveResult:
    """A finished, durable save."""

    step: int
    path: Path
    total_bytes: int
    seconds: float
    state_digest: str
    """:func:`recovery.checkpoint.format.state_digest` of what was saved."""
    deleted_steps: tuple[int, ...] = ()
    """Older steps removed by retention after this save became durable."""
    retention_errors: tuple[str, ...] = ()
    """Deletions that failed (the save itself succeeded; the step is retried next time)."""


@dataclass(frozen=True)
class Loaded:
    """A checkpoint that passed every check, with its arrays in host memory.

    On the CPU backend ``tree.from_host`` adopts these arrays without copying: do not write to
    them once they back a JAX state.
    """

    manifest: fmt.Manifest
    arrays: dict[str, np.ndarray]

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def state_digest(self) -> str:
        return fmt.state_digest(self.manifest.leaves)


@dataclass(frozen=True)
class RestoreResult:
    """The newest intact checkpoint and the newer ones skipped on the way to it."""

    loaded: Loaded
    fallbacks: list[tuple[int, str]] = field(default_factory=list)
    """``(step, reason)`` for each newer checkpoint that failed verification."""


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
        if not self.root.is_dir():
            return []
        found = (fmt.parse_step_dir(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(s for s in found if s is not None)

    def step_path(self, step: int) -> Path:
        return self.root / fmt.step_dir_name(step)

    def scan(self, *, deep: bool = True) -> list[StepStatus]:
        """Status of every committed step and every leftover, newest step first.

        ``deep`` re-reads and hashes every file; without it only the manifest and file sizes
        are checked (fast, but a flipped byte goes unnoticed).
        """
        out: list[StepStatus] = []
        now = self._clock()
        for step in reversed(self.steps()):
            path = self.step_path(step)
            size = _du(path)
            try:
                manifest = self._check(step, read=deep)
            except CheckpointDamaged as e:
                state: StepState = (
                    "incomplete" if e.reason.startswith(fmt.MANIFEST + " missing") else "corrupt"
                )
                out.append(StepStatus(path.name, step, state, e.reason, size, now - _mtime(path)))
                continue
            out.append(StepStatus(path.name, step, "intact", "", size, now - manifest.created_unix))
        if self.root.is_dir():
            for p in sorted(self.root.iterdir()):
                if p.name.startswith((fmt.TMP_PREFIX, fmt.TRASH_PREFIX)):
                    why = (
                        "interrupted save (removed by the next training run)"
                        if p.name.startswith(fmt.TMP_PREFIX)
                        else "interrupted deletion (removed by the next training run)"
                    )
                    out.append(StepStatus(p.name, None, "incomplete", why, _du(p), now - _mtime(p)))
                elif p.name.startswith(fmt.DAMAGED_PREFIX):
                    why = "set aside after failing verification during a restore"
                    out.append(StepStatus(p.name, None, "corrupt", why, _du(p), now - _mtime(p)))
        return out

    # --- verification and loading ------------------------------------------------------------

    def _manifest(self, step: int) -> fmt.Manifest:
        path = self.step_path(step) / fmt.MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointDamaged(
                step, f"{fmt.MANIFEST} missing (the save did not finish)"
            ) from None
        try:
            return fmt.parse_manifest(raw, dir_step=step)
        except fmt.ManifestInvalid as e:
            raise CheckpointDamaged(step, str(e)) from None

    def _check_config(self, manifest: fmt.Manifest, run_config: Mapping[str, Any]) -> None:
        if manifest.run_config_id != fmt.config_identity(run_config):
            diffs = fmt.config_differences(manifest.run_config, run_config)
            raise ConfigMismatchError(manifest.step, diffs)

    def _check(self, step: int, *, read: bool) -> fmt.Manifest:
        manifest = self._manifest(step)
        if read:
            self._read_all(step, manifest)
            return manifest
        directory = self.step_path(step)
        for f in manifest.files:
            try:
                size = (directory / f.name).stat().st_size
            except FileNotFoundError:
                raise CheckpointDamaged(step, f"data file {f.name} is missing") from None
            if size != f.nbytes:
                raise CheckpointDamaged(
                    step, f"data file {f.name} has {size} bytes, manifest says {f.nbytes}"
                )
        return manifest

    def _read_all(self, step: int, manifest: fmt.Manifest) -> dict[str, np.ndarray]:
        directory = self.step_path(step)
        by_file: dict[str, list[fmt.LeafEntry]] = {f.name: [] for f in manifest.files}
        for leaf in manifest.leaves:
            by_file[leaf.file].append(leaf)
        for group in by_file.values():
            group.sort(key=lambda leaf: leaf.offset)  # sequential reads

        # Allocated here, on this thread, rather than by the workers: see read_packed.
        buffers = {leaf.path: io.aligned_empty(leaf.nbytes) for leaf in manifest.leaves}

        def read(f: fmt.FileEntry) -> list[np.ndarray]:
            group = by_file[f.name]
            return io.read_packed(directory, f, group, [buffers[leaf.path] for leaf in group])

        # Reading from the page cache is CPU work (copy + hash), so threads beyond the cores
        # only pay for the GIL; from disk they keep the queue full. Scale with the bytes.
        threads = min(
            self._workers,
            len(manifest.files),
            2 * (os.cpu_count() or 1),
            max(1, manifest.total_bytes // _READ_BYTES_PER_THREAD),
        )
        try:
            if threads <= 1:
                results = [read(f) for f in manifest.files]
            else:
                with ThreadPoolExecutor(threads) as pool:
                    results = list(pool.map(read, manifest.files))
        except ValueError as e:
            raise CheckpointDamaged(step, str(e)) from None
        except OSError as e:
            raise CheckpointDamaged(step, f"cannot read: {e}") from None
        arrays: dict[str, np.ndarray] = {}
        for f, result in zip(manifest.files, results, strict=True):
            for leaf, arr in zip(by_file[f.name], result, strict=True):
                arrays[leaf.path] = arr
        return {leaf.path: arrays[leaf.path] for leaf in manifest.leaves}

    def verify(self, step: int, *, run_config: Mapping[str, Any] | None = None) -> fmt.Manifest:
        """Fully verify one step (every byte re-read and hashed).

        Raises:
            CheckpointDamaged: the step fails a check; ``reason`` says which.
            ConfigMismatchError: ``run_config`` is given and differs from the saved one.
        """
        manifest = self._manifest(step)
        if run_config is not None:
            self._check_config(manifest, run_config)
        self._read_all(step, manifest)
        return manifest

    def load(self, step: int, *, run_config: Mapping[str, Any] | None = None) -> Loaded:
        """Read and verify one step; arrays come back in host memory.

        Raises:
            CheckpointDamaged, ConfigMismatchError: as for :meth:`verify`.
        """
        manifest = self._manifest(step)
        if run_config is not None:
            self._check_config(manifest, run_config)
        return Loaded(manifest, self._read_all(step, manifest))

    def restore_latest(self, *, run_config: Mapping[str, Any]) -> RestoreResult:
        """Load the newest step that verifies, skipping (and reporting) damaged newer ones.

        Raises:
            NoCheckpointError: there is no checkpoint at all.
            AllCheckpointsDamagedError: every checkpoint failed; each reason is listed.
            ConfigMismatchError: the newest well-formed checkpoint belongs to a differently
                configured run - falling back would silently continue some other run.
        """
        steps = self.steps()
        if not steps:
            raise NoCheckpointError(
                f"resume requested but {self.root} holds no checkpoint "
                "(start without --resume, or point --run-dir at the run to continue)"
            )
        fallbacks: list[tuple[int, str]] = []
        for step in reversed(steps):
            try:
                return RestoreResult(self.load(step, run_config=run_config), fallbacks)
            except CheckpointDamaged as e:
                fallbacks.append((step, e.reason))
        raise AllCheckpointsDamagedError(str(self.root), fallbacks)

    # --- writing -----------------------------------------------------------------------------

    def save(
        self,
        step: int,
        arrays: Mapping[str, np.ndarray],
        *,
        run_config: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
    ) -> SaveResult:
        """Durably save ``arrays`` as checkpoint ``step``, then apply retention.

        Input is checked before anything is written. An existing ``step_N`` (for instance a
        damaged one) is replaced only once the new one is complete.

        Raises:
            UsageError: negative step, a leaf whose dtype cannot be stored (objects, strings,
                structured), or a run configuration / metadata that is not plain JSON.
            OSError: I/O failure; a ``.tmp-`` leftover remains for :meth:`remove_leftovers`
                and committed checkpoints are untouched.
        """
        if step < 0:
            raise UsageError(f"checkpoint step must be >= 0, got {step}")
        metadata = dict(metadata or {})
        for what, value in (("run configuration", run_config), ("metadata", metadata)):
            try:
                fmt.canonical_json(dict(value))
            except (TypeError, ValueError) as e:
                raise UsageError(f"checkpoint {what} must be plain JSON (no NaN): {e}") from None
        items = [(path, np.asarray(a)) for path, a in arrays.items()]
        for path, a in items:
            if not io.storable(a.dtype):
                raise UsageError(f"leaf {path!r} has dtype {a.dtype} which cannot be stored")
        t0 = time.perf_counter()
        self._make_root()
        final = self.step_path(step)
        tmp = self.root / f"{fmt.TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        views = [io.as_bytes(a) for _, a in items]
        plan = io.plan_files([len(v) for v in views], max_files=self._workers)

        def write(f: int) -> tuple[list[tuple[int, str]], int]:
            return io.write_packed(tmp / fmt.data_file_name(f), [views[i] for i in plan[f]])

        with ThreadPoolExecutor(max(1, min(self._workers, len(plan)))) as pool:
            written = list(pool.map(write, range(len(plan))))
        placement: dict[int, tuple[str, int, str]] = {}
        for f, (placed, _) in enumerate(written):
            for i, (offset, digest) in zip(plan[f], placed, strict=True):
                placement[i] = (fmt.data_file_name(f), offset, digest)
        leaves = [
            fmt.LeafEntry(
                path=path,
                file=placement[i][0],
                offset=placement[i][1],
                dtype=a.dtype.name,
                shape=tuple(a.shape),
                nbytes=len(views[i]),
                digest=placement[i][2],
            )
            for i, (path, a) in enumerate(items)
        ]
        files = [fmt.FileEntry(fmt.data_file_name(f), size) for f, (_, size) in enumerate(written)]
        manifest = fmt.build_manifest(
            step=step,
            created_unix=self._clock(),
            run_config=run_config,
            metadata=metadata,
            files=files,
            leaves=leaves,
        )
        io.write_small(tmp / fmt.MANIFEST, fmt.canonical_json(manifest))
        io.fsync_dir(tmp)
        replaced = None
        if final.exists():
            # Replace atomically (swap, then the old copy sits under the temporary name), so
            # that no crash leaves the step without a copy. Two renames where unsupported.
            replaced = tmp if io.exchange(tmp, final) else self._move_to_trash(final)
        if replaced is not tmp:
            os.rename(tmp, final)
        io.fsync_dir(self.root)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
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

    def _make_root(self) -> None:
        """Create the root and fsync each new directory's parent, so that the first
        checkpoint does not vanish with a root whose creation was never made durable."""
        missing = []
        p = self.root.absolute()
        while not p.exists():
            missing.append(p)
            p = p.parent
        self.root.mkdir(parents=True, exist_ok=True)
        for d in reversed(missing):
            io.fsync_dir(d.parent)

    def apply_retention(self, *, newest_durable: int) -> tuple[list[int], list[str]]:
        """Delete what the retention policy no longer keeps.

        Only steps older than ``newest_durable`` (a save that is already on stable storage)
        are candidates, so a newer checkpoint is always durable before an older one goes.
        A deletion that fails is reported, not raised: the checkpoints are intact either way
        and the next call tries again.

        Returns:
            ``(deleted steps, one message per failed deletion)``.
        """
        if self.retention is None:
            return [], []
        deleted, errors = [], []
        for step in steps_to_delete(self.steps(), self.retention, newest_durable=newest_durable):
            try:
                self._discard(self.step_path(step))
                deleted.append(step)
            except OSError as e:
                errors.append(f"step {step}: {e}")
        return deleted, errors

    def _move_to_trash(self, path: Path) -> Path:
        trash = self.root / f"{fmt.TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:12]}"
        os.rename(path, trash)
        return trash

    def _discard(self, path: Path) -> None:
        # Rename first (atomic) so a crash mid-delete never leaves a half-deleted step_N that
        # would later read as a damaged checkpoint.
        trash = self._move_to_trash(path)
        io.fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def set_aside(self, step: int) -> Path:
        """Move a damaged step out of the way (kept for inspection, never deleted by us)."""
        src = self.step_path(step)
        dst = self.root / f"{fmt.DAMAGED_PREFIX}{src.name}-{int(self._clock())}"
        os.rename(src, dst)
        io.fsync_dir(self.root)
        return dst

    def remove_leftovers(self) -> list[str]:
        """Delete temporary directories of interrupted saves and deletions.

        Call only while holding :class:`RunLock`: a live writer's temporary directory looks
        exactly like a leftover.
        """
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for p in self.root.iterdir():
            if p.name.startswith((fmt.TMP_PREFIX, fmt.TRASH_PREFIX)):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        return sorted(removed)


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
