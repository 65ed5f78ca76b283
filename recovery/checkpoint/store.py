"""Durable, verifiable checkpoints of a flat mapping ``leaf path -> numpy array``.

Save protocol (each step survives power loss, not only a killed process):

1. write every leaf into a temporary sibling directory ``.tmp-step_N-<id>``, hashing each
   buffer as it is written (no second read), then ``fsync`` each file;
2. write ``manifest.json`` last and ``fsync`` it, then ``fsync`` the temporary directory;
3. ``rename`` it to ``step_N`` and ``fsync`` the checkpoint root so the rename is durable.

A directory named ``step_N`` therefore always had all of its bytes on stable storage before
it got its name. Restore trusts nothing of that: it re-reads every file and checks sizes,
digests, the manifest's own checksum, the step and the run configuration.

This module knows nothing about JAX; :mod:`recovery.checkpoint.tree` converts pytrees.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recovery.checkpoint import format as fmt
from recovery.checkpoint.retention import RetentionPolicy, steps_to_delete
from recovery.errors import (
    AllCheckpointsDamagedError,
    CheckpointDamaged,
    ConfigMismatchError,
    NoCheckpointError,
    RunLockedError,
    UsageError,
)

_CHUNK = 64 * 1024 * 1024  # bytes per write()/readinto(); bounded so hashing overlaps I/O
_ALIGN = 64  # bytes; alignment of arrays read back (see _aligned_empty)
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


@dataclass(frozen=True)
class Loaded:
    """A checkpoint that passed every check, with its arrays in host memory."""

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


def _dtype(name: str) -> np.dtype[Any]:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # bfloat16, float8_*: registered by jax's own dependency

        try:
            return np.dtype(getattr(ml_dtypes, name))  # type: ignore[no-any-return]
        except AttributeError:
            raise TypeError(f"unknown dtype {name!r}") from None


def _as_bytes(arr: np.ndarray) -> memoryview:
    """A flat byte view of ``arr`` in C order and little-endian, copying only when needed."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.reshape(-1).view(np.uint8).data


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: memoryview) -> str:
    """Write ``data`` to a new file, fsync it, and return its digest (hashed while writing)."""
    hasher = fmt.new_hasher()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        for start in range(0, len(data), _CHUNK):
            chunk = data[start : start + _CHUNK]
            hasher.update(chunk)
            while chunk:
                written = os.write(fd, chunk)
                chunk = chunk[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return str(hasher.hexdigest())


def _aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised byte array whose data starts on a ``_ALIGN`` boundary.

    jax's CPU backend adopts a host array without copying only when it is 64-byte aligned;
    numpy's allocator guarantees 16. Aligning here makes ``tree.from_host`` free on CPU (a
    full copy of the state otherwise) and costs nothing elsewhere.
    """
    buf = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    start = -buf.ctypes.data % _ALIGN
    return buf[start : start + nbytes]


def _read_leaf(directory: Path, entry: fmt.LeafEntry) -> np.ndarray:
    """Read and verify one leaf file. Raises ValueError with the reason on any mismatch."""
    # Plain fds and preadv rather than pathlib and file objects: at a few hundred small
    # leaves the per-file Python overhead is most of a restore.
    try:
        fd = os.open(os.path.join(directory, entry.file), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"leaf file {entry.file} ({entry.path}) is missing") from None
    try:
        size = os.fstat(fd).st_size
        if size != entry.nbytes:
            raise ValueError(
                f"leaf file {entry.file} ({entry.path}) has {size} bytes, manifest says "
                f"{entry.nbytes} (truncated or overwritten)"
            )
        try:
            dtype = _dtype(entry.dtype)
        except TypeError as e:
            raise ValueError(f"leaf {entry.path}: {e}") from None
        if min(entry.shape, default=0) < 0 or (
            math.prod(entry.shape) * dtype.itemsize != entry.nbytes
        ):
            raise ValueError(
                f"leaf {entry.path}: shape {entry.shape} x {dtype} != {entry.nbytes} B"
            )
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead from disk
        out = _aligned_empty(entry.nbytes)
        view = out.data
        hasher = fmt.new_hasher()
        pos = 0
        while pos < entry.nbytes:
            n = os.preadv(fd, [view[pos : pos + _CHUNK]], pos)
            if not n:
                raise ValueError(f"leaf file {entry.file} ended early at byte {pos}")
            hasher.update(view[pos : pos + n])
            pos += n
    finally:
        os.close(fd)
    if hasher.hexdigest() != entry.digest:
        raise ValueError(
            f"leaf file {entry.file} ({entry.path}) content digest mismatch "
            "(bytes changed on disk)"
        )
    return out.view(dtype).reshape(entry.shape)


class CheckpointStore:
    """Checkpoints of one run, one directory per step under ``root``.

    Args:
        root: the checkpoint root (created on the first save).
        clock: wall clock in seconds, for manifest timestamps and ages.
        workers: threads that write/read leaves in parallel. Most of a save is spent in
            ``fsync``, which blocks without using a CPU; many fsyncs in flight at once keep
            the disk's queue full and let the filesystem commit them in one journal
            transaction, so this is well above the core count (see
            ``benchmarks/README.md`` for the measurements behind 16).
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
                out.append(
                    StepStatus(path.name, step, state, e.reason, size, now - _mtime(path))
                )
                continue
            out.append(
                StepStatus(path.name, step, "intact", "", size, now - manifest.created_unix)
            )
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
        else:
            directory = self.step_path(step)
            for entry in manifest.leaves:
                p = directory / entry.file
                if not p.exists():
                    raise CheckpointDamaged(step, f"leaf file {entry.file} is missing")
                if p.stat().st_size != entry.nbytes:
                    raise CheckpointDamaged(step, f"leaf file {entry.file} has the wrong size")
        return manifest

    def _read_all(self, step: int, manifest: fmt.Manifest) -> dict[str, np.ndarray]:
        directory = self.step_path(step)
        # Reading from the page cache is CPU work (copy + hash), so threads beyond the cores
        # only pay for the GIL; from disk they keep the queue full. Scale with the bytes.
        threads = min(self._workers, max(1, manifest.total_bytes // _READ_BYTES_PER_THREAD))
        try:
            if threads == 1:
                arrays = [_read_leaf(directory, e) for e in manifest.leaves]
            else:
                with ThreadPoolExecutor(threads) as pool:
                    arrays = list(pool.map(lambda e: _read_leaf(directory, e), manifest.leaves))
        except ValueError as e:
            raise CheckpointDamaged(step, str(e)) from None
        except OSError as e:
            raise CheckpointDamaged(step, f"cannot read: {e}") from None
        return {entry.path: arr for entry, arr in zip(manifest.leaves, arrays, strict=True)}

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

        An existing ``step_N`` (for instance a damaged one) is replaced only after the new
        one is complete. Raises OSError on I/O failure, leaving a ``.tmp-`` leftover that the
        next :meth:`remove_leftovers` deletes; committed checkpoints are never touched then.
        """
        if step < 0:
            raise UsageError(f"checkpoint step must be >= 0, got {step}")
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.step_path(step)
        tmp = self.root / f"{fmt.TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        items = list(arrays.items())
        files = [f"L{i:05d}.bin" for i in range(len(items))]
        views = [_as_bytes(np.asarray(a)) for _, a in items]

        def write(i: int) -> str:
            return _write_file(tmp / files[i], views[i])

        # Largest first so the workers finish together.
        order = sorted(range(len(items)), key=lambda i: -len(views[i]))
        with ThreadPoolExecutor(self._workers) as pool:
            digests = dict(zip(order, pool.map(write, order), strict=True))
        leaves = [
            fmt.LeafEntry(
                path=path,
                file=files[i],
                dtype=np.asarray(a).dtype.name,
                shape=tuple(np.shape(a)),
                nbytes=len(views[i]),
                digest=digests[i],
            )
            for i, (path, a) in enumerate(items)
        ]
        manifest = fmt.build_manifest(
            step=step,
            created_unix=self._clock(),
            run_config=run_config,
            metadata=metadata or {},
            leaves=leaves,
        )
        _write_file(tmp / fmt.MANIFEST, memoryview(fmt.canonical_json(manifest)))
        _fsync_dir(tmp)
        if final.exists():
            self._discard(final)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        deleted = self.apply_retention(newest_durable=step) if self.retention else []
        return SaveResult(
            step=step,
            path=final,
            total_bytes=sum(leaf.nbytes for leaf in leaves),
            seconds=time.perf_counter() - t0,
            state_digest=fmt.state_digest(leaves),
            deleted_steps=tuple(deleted),
        )

    def apply_retention(self, *, newest_durable: int) -> list[int]:
        """Delete what the retention policy no longer keeps; returns the deleted steps.

        Only steps older than ``newest_durable`` (a save that is already on stable storage)
        are candidates, so a newer checkpoint is always durable before an older one goes.
        """
        if self.retention is None:
            return []
        doomed = steps_to_delete(self.steps(), self.retention, newest_durable=newest_durable)
        for step in doomed:
            self._discard(self.step_path(step))
        return doomed

    def _discard(self, path: Path) -> None:
        # Rename first (atomic) so a crash mid-delete never leaves a half-deleted step_N that
        # would later read as a damaged checkpoint.
        trash = self.root / f"{fmt.TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:12]}"
        os.rename(path, trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def set_aside(self, step: int) -> Path:
        """Move a damaged step out of the way (kept for inspection, never deleted by us)."""
        src = self.step_path(step)
        dst = self.root / f"{fmt.DAMAGED_PREFIX}{src.name}-{int(self._clock())}"
        os.rename(src, dst)
        _fsync_dir(self.root)
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


class RunLock:
    """Exclusive lock on a checkpoint root: one writer per run at a time.

    Uses ``flock`` on ``<root>/.lock``, which the kernel releases when the process dies, so a
    SIGKILLed run never leaves a stale lock behind.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises RunLockedError, naming the holder's pid, if another process holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLockedError(
                f"{self.root} is in use by another training process (pid {holder}); "
                "two writers would corrupt the run"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(self) -> Iterator[RunLock]:
        self.acquire()
        try:
            yield self
        finally:
            self.release()


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
