"""Verify and load checkpoints: trust nothing on disk until it has been re-read and hashed.

A step is loaded only after its manifest parses and checksums, its step and run
configuration match, and every data file has the recorded size and every leaf the recorded
digest. :func:`restore_latest` falls back from a damaged step to the next older one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recovery.checkpoint import files as io
from recovery.checkpoint import format as fmt
from recovery.errors import (
    AllCheckpointsDamagedError,
    CheckpointDamaged,
    ConfigMismatchError,
    NoCheckpointError,
)

_READ_BYTES_PER_THREAD = 16 * 1024 * 1024  # a restore uses one thread per this much


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

    @property
    def key_impls(self) -> dict[str, str]:
        """``leaf path -> key implementation`` of the leaves that hold JAX PRNG keys' data."""
        return {leaf.path: leaf.key_impl for leaf in self.manifest.leaves if leaf.key_impl}


@dataclass(frozen=True)
class RestoreResult:
    """The newest intact checkpoint and the newer ones skipped on the way to it."""

    loaded: Loaded
    fallbacks: list[tuple[int, str]] = field(default_factory=list)
    """``(step, reason)`` for each newer checkpoint that failed verification."""


def read_manifest(root: Path, step: int) -> fmt.Manifest:
    """Parse and check ``step``'s manifest (format, checksum, step number); no data is read.

    Raises:
        CheckpointDamaged: missing or invalid manifest.
    """
    path = root / fmt.step_dir_name(step) / fmt.MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if not path.parent.is_dir():  # another process's view of a shared root may lack it
            raise CheckpointDamaged(step, f"{path.parent.name} is missing") from None
        raise CheckpointDamaged(step, f"{fmt.MANIFEST} missing (the save did not finish)") from None
    try:
        return fmt.parse_manifest(raw, dir_step=step)
    except fmt.ManifestInvalid as e:
        raise CheckpointDamaged(step, str(e)) from None


def check_config(manifest: fmt.Manifest, run_config: Mapping[str, Any]) -> None:
    """Raises ConfigMismatchError, listing each difference, unless ``run_config`` is the
    configuration the checkpoint was saved with."""
    if manifest.run_config_id != fmt.config_identity(run_config):
        diffs = fmt.config_differences(manifest.run_config, run_config)
        raise ConfigMismatchError(manifest.step, diffs)


def check(root: Path, step: int, *, read: bool, workers: int) -> fmt.Manifest:
    """The manifest of ``step`` once its data checks out: every byte re-read and hashed when
    ``read``, else only each data file's size (fast; a flipped byte goes unnoticed).

    Raises:
        CheckpointDamaged: the step fails a check; ``reason`` says which.
    """
    manifest = read_manifest(root, step)
    if read:
        read_all(root, step, manifest, workers=workers)
        return manifest
    directory = root / fmt.step_dir_name(step)
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


def read_all(
    root: Path, step: int, manifest: fmt.Manifest, *, workers: int
) -> dict[str, np.ndarray]:
    """Read and hash every leaf ``manifest`` lists, with up to ``workers`` threads.

    Returns:
        ``leaf path -> array`` in manifest order.
    Raises:
        CheckpointDamaged: a file is missing, resized, unreadable, or a digest differs.
    """
    directory = root / fmt.step_dir_name(step)
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

    threads = _read_threads(manifest, workers)
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


def _read_threads(manifest: fmt.Manifest, workers: int) -> int:
    # Reading from the page cache is CPU work (copy + hash), so threads beyond the cores
    # only pay for the GIL; from disk they keep the queue full. Scale with the bytes.
    return min(
        workers,
        len(manifest.files),
        2 * (os.cpu_count() or 1),
        max(1, manifest.total_bytes // _READ_BYTES_PER_THREAD),
    )


def load(root: Path, step: int, *, run_config: Mapping[str, Any] | None, workers: int) -> Loaded:
    """Read and verify one step; the run configuration is checked first when given.

    Raises:
        CheckpointDamaged: the step fails a check.
        ConfigMismatchError: ``run_config`` differs from the saved one.
    """
    manifest = read_manifest(root, step)
    if run_config is not None:
        check_config(manifest, run_config)
    return Loaded(manifest, read_all(root, step, manifest, workers=workers))


def restore_latest(
    root: Path, steps: Sequence[int], *, run_config: Mapping[str, Any], workers: int
) -> RestoreResult:
    """Load the newest of ``steps`` (ascending) that verifies, reporting damaged newer ones.

    Raises:
        NoCheckpointError: ``steps`` is empty.
        AllCheckpointsDamagedError: every step failed; each reason is listed.
        ConfigMismatchError: the newest well-formed checkpoint belongs to a differently
            configured run - falling back would silently continue some other run.
    """
    if not steps:
        raise NoCheckpointError(
            f"resume requested but {root} holds no checkpoint "
            "(start without --resume, or point --run-dir at the run to continue)"
        )
    fallbacks: list[tuple[int, str]] = []
    for step in reversed(steps):
        try:
            loaded = load(root, step, run_config=run_config, workers=workers)
            return RestoreResult(loaded, fallbacks)
        except CheckpointDamaged as e:
            fallbacks.append((step, e.reason))
    raise AllCheckpointsDamagedError(str(root), fallbacks)
