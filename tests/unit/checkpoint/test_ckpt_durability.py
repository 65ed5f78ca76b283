"""The save protocol's order of operations, recorded through a stand-in for ``os``.

The stand-in replaces ``os`` in every module of the save protocol: ``files`` (data files),
``fsutil`` (the manifest and directory fsyncs) and ``commit`` (the renames).

The order is what makes a save survive power loss: every byte is on stable storage before the
step directory gets its name, and the name is on stable storage before anything older goes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore, RetentionPolicy
from recovery.checkpoint import files as files_mod
from recovery.checkpoint import format as fmt
from tests.unit.checkpoint.conftest import patch_os
from tests.unit.conftest import TracingOs

ArraysFor = Callable[[int], dict[str, np.ndarray]]
SplitInto = Callable[[int], None]


def _trace(monkeypatch: pytest.MonkeyPatch) -> TracingOs:
    tracer = TracingOs()
    patch_os(monkeypatch, tracer)
    return tracer


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> TracingOs:
    return _trace(monkeypatch)


def _commit_rename(tracer: TracingOs, final: Path) -> tuple[int, Path]:
    (hit,) = [
        (i, src) for i, (op, src, dst) in enumerate(tracer.trace) if op == "rename" and dst == final
    ]
    return hit


@pytest.mark.parametrize(("workers", "files"), [(1, 1), (4, 1), (1, 3), (4, 3)])
def test_save_makes_everything_durable_before_naming_it(
    root: Path,
    arrays_for: ArraysFor,
    run_config: dict[str, Any],
    split_into: SplitInto,
    workers: int,
    files: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if files > 1:
        split_into(files)
    traced = _trace(monkeypatch)
    store = CheckpointStore(root, workers=workers)
    arrays = {**arrays_for(2), "extra/0": np.ones(1000), "extra/1": np.zeros((0, 3))}

    result = store.save(2, arrays, run_config=run_config)

    final = store.step_path(2)
    i_rename, tmp = _commit_rename(traced, final)
    assert tmp.parent == root
    assert tmp.name.startswith(".tmp-step_00000002-")
    data_files = [p for op, p, _ in traced.trace if op == "open" and p.parent == tmp]
    data_files = [p for p in data_files if p.name != fmt.MANIFEST]
    assert sorted(p.name for p in data_files) == [fmt.data_file_name(i) for i in range(files)]
    written = store.load(2).manifest.files
    assert sorted(f.name for f in written) == sorted(p.name for p in data_files)
    assert sum(f.nbytes for f in written) >= result.total_bytes

    i_manifest_open = traced.index("open", tmp / fmt.MANIFEST)
    for data_file in data_files:
        assert traced.index("fsync", data_file) < i_manifest_open, f"{data_file.name} not fsynced"
    i_manifest_fsync = traced.index("fsync", tmp / fmt.MANIFEST, after=i_manifest_open)
    i_tmp_fsync = traced.index("fsync", tmp, after=i_manifest_fsync)
    assert i_tmp_fsync < i_rename, "temporary directory not fsynced before the rename"
    traced.index("fsync", root, after=i_rename)  # the rename itself is made durable
    assert final.is_dir()
    assert not tmp.exists()


def test_every_data_file_is_written_completely_before_its_fsync(
    root: Path,
    arrays_for: ArraysFor,
    run_config: dict[str, Any],
    split_into: SplitInto,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An fsync only covers what was written before it: no write may follow a file's fsync."""
    split_into(3)
    writes: list[tuple[str, int]] = []
    tracer = _trace(monkeypatch)
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        with tracer._lock:
            writes.append((tracer._paths[fd].name, len(tracer.trace)))
        return real_write(fd, data)

    monkeypatch.setattr(tracer, "write", write, raising=False)
    store = CheckpointStore(root, workers=1)
    store.save(2, arrays_for(2), run_config=run_config)

    for name in ["D00000.bin", "D00001.bin", "D00002.bin", fmt.MANIFEST]:
        (i_fsync,) = [
            i for i, (op, p, _) in enumerate(tracer.trace) if op == "fsync" and p.name == name
        ]
        mine = [at for n, at in writes if n == name]
        assert mine, name
        assert all(at <= i_fsync for at in mine), f"{name} written after its fsync"


def test_retention_deletes_only_after_the_new_step_is_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root, retention=RetentionPolicy(keep_last=1))
    store.save(1, arrays_for(1), run_config=run_config)
    tracer = _trace(monkeypatch)

    result = store.save(2, arrays_for(2), run_config=run_config)

    assert result.deleted_steps == (1,)
    i_rename, _ = _commit_rename(tracer, store.step_path(2))
    i_root_fsync = tracer.index("fsync", root, after=i_rename)
    trash_moves = [
        i
        for i, (op, src, dst) in enumerate(tracer.trace)
        if op == "rename" and src == store.step_path(1)
    ]
    assert len(trash_moves) == 1
    (i_trash,) = trash_moves
    assert i_trash > i_root_fsync, f"step 1 moved before step 2 was durable:\n{tracer}"
    trash = tracer.trace[i_trash][2]
    assert trash is not None
    assert trash.name.startswith(".trash-step_00000001-")
    tracer.index("fsync", root, after=i_trash)
    assert store.steps() == [2]
    assert not trash.exists()


def _track_deletions(monkeypatch: pytest.MonkeyPatch, tracer: TracingOs) -> list[tuple[Path, int]]:
    """Record each ``shutil.rmtree`` of the store with the trace position it happened at."""
    deletions: list[tuple[Path, int]] = []
    real_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        deletions.append((Path(path), len(tracer.trace)))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)  # the module the store deletes with
    return deletions


def _trace_exchange(monkeypatch: pytest.MonkeyPatch, tracer: TracingOs, *, supported: bool) -> None:
    """Record ``files.exchange`` in the trace; ``supported=False`` forces the fallback."""
    real = files_mod.exchange

    def exchange(a: Path, b: Path) -> bool:
        if not supported:
            return False
        done = real(a, b)
        with tracer._lock:
            tracer.trace.append(("exchange", Path(a), Path(b)))
        return done

    monkeypatch.setattr(files_mod, "exchange", exchange)


def test_replacing_a_step_swaps_it_atomically_after_the_new_copy_is_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root)
    store.save(3, arrays_for(1), run_config=run_config)
    tracer = _trace(monkeypatch)
    _trace_exchange(monkeypatch, tracer, supported=True)
    deletions = _track_deletions(monkeypatch, tracer)

    store.save(3, arrays_for(3), run_config=run_config)

    final = store.step_path(3)
    ((i_swap, tmp),) = [
        (i, a) for i, (op, a, b) in enumerate(tracer.trace) if op == "exchange" and b == final
    ]
    assert not [e for e in tracer.trace if e[0] == "rename" and e[2] == final]
    assert tracer.index("fsync", tmp) < i_swap, "new copy not durable before the swap"
    i_root = tracer.index("fsync", root, after=i_swap)
    ((old_copy, at),) = deletions
    assert old_copy == tmp  # after the swap the old copy sits under the temporary name
    assert at > i_root, f"old copy deleted before the swap was durable:\n{tracer}"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000003"]
    assert store.load(3).arrays["opt/count"] == 3


def test_replacing_a_step_keeps_the_old_one_until_the_new_one_is_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fallback where renameat2(RENAME_EXCHANGE) is unavailable: two renames via .trash-."""
    store = CheckpointStore(root)
    store.save(3, arrays_for(1), run_config=run_config)
    tracer = _trace(monkeypatch)
    _trace_exchange(monkeypatch, tracer, supported=False)
    deletions = _track_deletions(monkeypatch, tracer)

    store.save(3, arrays_for(3), run_config=run_config)

    i_rename, tmp = _commit_rename(tracer, store.step_path(3))
    i_tmp_fsync = tracer.index("fsync", tmp)
    (i_old,) = [
        i
        for i, (op, src, dst) in enumerate(tracer.trace)
        if op == "rename" and src == store.step_path(3) and i < i_rename
    ]
    assert i_tmp_fsync < i_old < i_rename
    trash = tracer.trace[i_old][2]
    assert trash is not None
    assert trash.parent == root
    assert trash.name.startswith(".trash-step_00000003-")
    i_root_fsync = tracer.index("fsync", root, after=i_rename)
    ((deleted, at),) = deletions
    assert deleted == trash
    assert at > i_root_fsync, f"old step deleted before the new one was durable:\n{tracer}"
    assert not trash.exists(), "the replaced step is deleted once the new one is durable"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000003"]


def test_first_save_makes_the_new_root_durable(
    tmp_path: Path, arrays_for: ArraysFor, run_config: dict[str, Any], traced: TracingOs
) -> None:
    root = tmp_path / "runs" / "r1"
    CheckpointStore(root).save(0, arrays_for(0), run_config=run_config)
    i_rename, _ = _commit_rename(traced, root / "step_00000000")
    assert traced.index("fsync", root.parent) < i_rename
    assert traced.index("fsync", tmp_path) < i_rename


def test_a_save_into_an_existing_root_fsyncs_no_parent(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root)
    store.save(0, arrays_for(0), run_config=run_config)
    tracer = _trace(monkeypatch)
    store.save(1, arrays_for(1), run_config=run_config)
    assert not [p for op, p, _ in tracer.trace if op == "fsync" and p == root.parent]


def test_set_aside_is_made_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root)
    store.save(1, arrays_for(1), run_config=run_config)
    tracer = _trace(monkeypatch)

    moved = store.set_aside(1)

    i = tracer.index("rename", store.step_path(1), moved)
    tracer.index("fsync", root, after=i)
