"""The commit protocol: how a step gets its name only after all of it is durable.

Each step of a save survives power loss, not only a killed process:

1. pack the leaves into a few data files in a temporary sibling directory
   ``.tmp-step_N-<id>`` (:func:`new_tmp_dir`, :func:`write_data`), hashing each leaf as it
   is written (no second read), and ``fsync`` each file (files are written in parallel:
   fsync waits, it does not compute);
2. write ``manifest.json`` last and ``fsync`` it, then ``fsync`` the temporary directory
   (:func:`write_manifest`);
3. ``rename`` it to ``step_N`` - or swap it with an existing ``step_N`` - and ``fsync`` the
   checkpoint root so the rename is durable (:func:`publish`);
4. only then delete what retention no longer keeps (:func:`apply_retention`).

A directory named ``step_N`` therefore always had all of its bytes on stable storage before
it got its name. Deletions rename to ``.trash-`` first, so no crash leaves a half-deleted
``step_N`` that would read as damaged. Every system call goes through ``os`` (or
:mod:`recovery.fsutil`) looked up on the module, so tests trace and crash them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recovery import fsutil
from recovery.checkpoint import files as io
from recovery.checkpoint import format as fmt
from recovery.checkpoint.retention import RetentionPolicy, steps_to_delete
from recovery.checkpoint.scan import committed_steps, leftovers
from recovery.errors import UsageError

Leaf = tuple[str, np.ndarray]


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


def checked_input(
    step: int,
    arrays: Mapping[str, np.ndarray],
    run_config: Mapping[str, Any],
    metadata: Mapping[str, Any],
    key_impls: Mapping[str, str] | None = None,
) -> list[Leaf]:
    """The leaves to save as ``(path, array)``, once the whole input is known to be storable.

    ``key_impls`` names the leaves that hold the data of JAX PRNG keys, with each one's key
    implementation (:attr:`recovery.checkpoint.format.LeafEntry.key_impl`).

    Raises:
        UsageError: negative step, a leaf whose dtype cannot be stored (objects, strings,
            structured), a run configuration / metadata that is not plain JSON, or a key
            implementation for a path that is no leaf.
    """
    unknown = sorted(set(key_impls or {}) - set(arrays))
    if unknown:
        raise UsageError(f"key implementations given for paths that are no leaf: {unknown}")
    if step < 0:
        raise UsageError(f"checkpoint step must be >= 0, got {step}")
    for what, value in (("run configuration", run_config), ("metadata", metadata)):
        try:
            fmt.canonical_json(dict(value))
        except (TypeError, ValueError) as e:
            raise UsageError(f"checkpoint {what} must be plain JSON (no NaN): {e}") from None
    items = [(path, np.asarray(a)) for path, a in arrays.items()]
    for path, a in items:
        if not io.storable(a.dtype):
            raise UsageError(
                f"leaf {path!r} has dtype {a.dtype}, which cannot be stored: a checkpoint "
                "holds arrays of plain values (bfloat16, float32, int8, bool, datetime64, ...), "
                "not strings, bytes, objects or structured records"
            )
    return items


def make_root(root: Path) -> None:
    """Create ``root`` and fsync each new directory's parent, so that the first checkpoint
    does not vanish with a root whose creation was never made durable."""
    missing = []
    p = root.absolute()
    while not p.exists():
        missing.append(p)
        p = p.parent
    root.mkdir(parents=True, exist_ok=True)
    for d in reversed(missing):
        fsutil.fsync_dir(d.parent)


def new_tmp_dir(root: Path, final: Path) -> Path:
    """A fresh ``.tmp-<final name>-<id>`` directory in ``root`` for the save of ``final``."""
    tmp = root / f"{fmt.TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    return tmp


def write_data(
    tmp: Path,
    items: Sequence[Leaf],
    *,
    workers: int,
    key_impls: Mapping[str, str] | None = None,
) -> tuple[list[fmt.LeafEntry], list[fmt.FileEntry]]:
    """Pack ``items`` into at most ``workers`` data files in ``tmp``, written in parallel and
    each fsynced; return the manifest entries of the leaves (in ``items`` order) and files.

    Raises:
        OSError: a write or fsync failed; what was written stays in ``tmp``.
    """
    views = [io.as_bytes(a) for _, a in items]
    plan = io.plan_files([len(v) for v in views], max_files=workers)
    written = write_files(tmp, views, plan, range(len(plan)), workers=workers)
    return manifest_entries(items, plan, written, key_impls)


Written = dict[int, tuple[list[tuple[int, str]], int]]
"""Data file index -> ``([(offset, digest) per leaf of the file], file size)``."""


def write_files(
    tmp: Path,
    views: Sequence[memoryview],
    plan: Sequence[Sequence[int]],
    files: Sequence[int],
    *,
    workers: int,
) -> Written:
    """Write data files ``files`` (indices into ``plan``, which lists each file's leaves) in
    parallel, each fsynced. A process of a multi-process save writes its share this way.

    Raises:
        OSError: a write or fsync failed; what was written stays in ``tmp``.
    """

    def write(f: int) -> tuple[list[tuple[int, str]], int]:
        return io.write_packed(tmp / fmt.data_file_name(f), [views[i] for i in plan[f]])

    with ThreadPoolExecutor(max(1, min(workers, len(files)))) as pool:
        return dict(zip(files, pool.map(write, files), strict=True))


def manifest_entries(
    items: Sequence[Leaf],
    plan: Sequence[Sequence[int]],
    written: Written,
    key_impls: Mapping[str, str] | None = None,
) -> tuple[list[fmt.LeafEntry], list[fmt.FileEntry]]:
    """The manifest's leaf entries (in ``items`` order) and file entries, once every file of
    ``plan`` is ``written``; a leaf named in ``key_impls`` records its key implementation."""
    key_impls = key_impls or {}
    placement: dict[int, tuple[str, int, str]] = {}
    for f in range(len(plan)):
        placed, _ = written[f]
        for i, (offset, digest) in zip(plan[f], placed, strict=True):
            placement[i] = (fmt.data_file_name(f), offset, digest)
    leaves = [
        fmt.LeafEntry(
            path=path,
            file=placement[i][0],
            offset=placement[i][1],
            dtype=a.dtype.name,
            shape=tuple(a.shape),
            nbytes=a.nbytes,
            digest=placement[i][2],
            key_impl=key_impls.get(path),
        )
        for i, (path, a) in enumerate(items)
    ]
    files = [fmt.FileEntry(fmt.data_file_name(f), written[f][1]) for f in range(len(plan))]
    return leaves, files


def write_manifest(tmp: Path, manifest: Mapping[str, Any]) -> None:
    """Write the manifest (last, after every data file is durable), fsync it, then fsync
    ``tmp`` so that every entry in it is durable before it is named."""
    fsutil.write_new(tmp / fmt.MANIFEST, fmt.canonical_json(manifest))
    fsutil.fsync_dir(tmp)


def publish(root: Path, tmp: Path, final: Path) -> None:
    """Give the complete ``tmp`` the name ``final`` and make that durable.

    An existing ``final`` (for instance a damaged step) is replaced atomically: swapped, so
    that the old copy sits under the temporary name and no crash leaves the step without a
    copy; two renames (via ``.trash-``) where the swap is unsupported. The old copy is
    deleted only once the new name is durable.

    Raises:
        OSError: a rename or fsync failed; ``tmp`` remains as a leftover.
    """
    replaced = None
    if final.exists():
        replaced = tmp if io.exchange(tmp, final) else move_to_trash(root, final)
    if replaced is not tmp:
        os.rename(tmp, final)
    fsutil.fsync_dir(root)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def move_to_trash(root: Path, path: Path) -> Path:
    trash = root / f"{fmt.TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:12]}"
    os.rename(path, trash)
    return trash


def discard(root: Path, path: Path) -> None:
    """Delete a step directory: rename first (atomic) so a crash mid-delete never leaves a
    half-deleted ``step_N`` that would later read as a damaged checkpoint."""
    trash = move_to_trash(root, path)
    fsutil.fsync_dir(root)
    shutil.rmtree(trash, ignore_errors=True)


def apply_retention(
    root: Path, policy: RetentionPolicy | None, *, newest_durable: int
) -> tuple[list[int], list[str]]:
    """Delete the steps older than ``newest_durable`` that ``policy`` no longer keeps.

    Returns ``(deleted steps, one message per failed deletion)``; failures are not raised.
    """
    if policy is None:
        return [], []
    deleted, errors = [], []
    for step in steps_to_delete(committed_steps(root), policy, newest_durable=newest_durable):
        try:
            discard(root, root / fmt.step_dir_name(step))
            deleted.append(step)
        except OSError as e:
            errors.append(f"step {step}: {e}")
    return deleted, errors


def set_aside(root: Path, step: int, *, now: float) -> Path:
    """Rename a damaged step to ``.damaged-step_N-<now>`` and make that durable."""
    src = root / fmt.step_dir_name(step)
    dst = root / f"{fmt.DAMAGED_PREFIX}{src.name}-{int(now)}"
    os.rename(src, dst)
    fsutil.fsync_dir(root)
    return dst


def remove_leftovers(root: Path) -> list[str]:
    """Delete the temporary directories of interrupted saves and deletions; their names."""
    removed = leftovers(root)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in removed]
