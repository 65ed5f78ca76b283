"""The save protocol's order of operations, recorded through a stand-in for ``os``.

The order is what makes a save survive power loss: every byte is on stable storage before the
step directory gets its name, and the name is on stable storage before anything older goes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore, RetentionPolicy
from recovery.checkpoint import format as fmt
from recovery.checkpoint import store as store_mod

ArraysFor = Callable[[int], dict[str, np.ndarray]]
Op = tuple[str, Path, Path | None]


class TracingOs:
    """Forwards to ``os``, recording open/fsync/rename with the paths involved.

    fsync gets a file descriptor; the path comes from the open that returned it. The mapping
    is dropped *before* the real close, so a descriptor number reused by another thread is
    never attributed to the old path.
    """

    def __init__(self) -> None:
        self.trace: list[Op] = []
        self._paths: dict[int, Path] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        fd = os.open(path, flags, mode, **kwargs)
        with self._lock:
            self._paths[fd] = Path(path)
            self.trace.append(("open", Path(path), None))
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        os.close(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        with self._lock:
            self.trace.append(("fsync", self._paths[fd], None))

    def rename(self, src: Any, dst: Any) -> None:
        os.rename(src, dst)
        with self._lock:
            self.trace.append(("rename", Path(src), Path(dst)))

    def index(self, op: str, path: Path, dst: Path | None = None, *, after: int = -1) -> int:
        for i, entry in enumerate(self.trace):
            if i > after and entry == (op, path, dst):
                return i
        raise AssertionError(f"no {op} {path} {dst or ''} after #{after} in trace:\n{self}")

    def __str__(self) -> str:
        return "\n".join(f"  #{i} {op} {a} {b or ''}" for i, (op, a, b) in enumerate(self.trace))


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> TracingOs:
    tracer = TracingOs()
    monkeypatch.setattr(store_mod, "os", tracer)
    return tracer


def _commit_rename(tracer: TracingOs, final: Path) -> tuple[int, Path]:
    (hit,) = [
        (i, src) for i, (op, src, dst) in enumerate(tracer.trace) if op == "rename" and dst == final
    ]
    return hit


@pytest.mark.parametrize("workers", [1, 4])
def test_save_makes_everything_durable_before_naming_it(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], traced: TracingOs, workers: int
) -> None:
    store = CheckpointStore(root, workers=workers)
    arrays = {**arrays_for(2), "extra/0": np.ones(1000), "extra/1": np.zeros((0, 3))}

    store.save(2, arrays, run_config=run_config)

    final = store.step_path(2)
    i_rename, tmp = _commit_rename(traced, final)
    assert tmp.parent == root
    assert tmp.name.startswith(".tmp-step_00000002-")
    leaves = [p for op, p, _ in traced.trace if op == "open" and p.parent == tmp]
    leaves = [p for p in leaves if p.name != fmt.MANIFEST]
    assert len(leaves) == len(arrays)

    i_manifest_open = traced.index("open", tmp / fmt.MANIFEST)
    for leaf in leaves:
        assert traced.index("fsync", leaf) < i_manifest_open, f"{leaf.name} not fsynced first"
    i_manifest_fsync = traced.index("fsync", tmp / fmt.MANIFEST, after=i_manifest_open)
    i_tmp_fsync = traced.index("fsync", tmp, after=i_manifest_fsync)
    assert i_tmp_fsync < i_rename, "temporary directory not fsynced before the rename"
    traced.index("fsync", root, after=i_rename)  # the rename itself is made durable
    assert final.is_dir()
    assert not tmp.exists()


def test_retention_deletes_only_after_the_new_step_is_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root, retention=RetentionPolicy(keep_last=1))
    store.save(1, arrays_for(1), run_config=run_config)
    tracer = TracingOs()
    monkeypatch.setattr(store_mod, "os", tracer)

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


def test_replacing_a_step_keeps_the_old_one_until_the_new_one_is_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root)
    store.save(3, arrays_for(1), run_config=run_config)
    tracer = TracingOs()
    monkeypatch.setattr(store_mod, "os", tracer)

    store.save(3, arrays_for(3), run_config=run_config)

    i_rename, tmp = _commit_rename(tracer, store.step_path(3))
    i_tmp_fsync = tracer.index("fsync", tmp)
    (i_old,) = [
        i
        for i, (op, src, dst) in enumerate(tracer.trace)
        if op == "rename" and src == store.step_path(3) and i < i_rename
    ]
    assert i_tmp_fsync < i_old < i_rename
    tracer.index("fsync", root, after=i_rename)


@pytest.mark.xfail(
    strict=True,
    reason="BUG: the first save creates the checkpoint root (mkdir parents=True) but never"
    " fsyncs its parent, so a power loss can drop the whole root after save() returned",
)
def test_first_save_makes_the_new_root_durable(
    tmp_path: Path, arrays_for: ArraysFor, run_config: dict[str, Any], traced: TracingOs
) -> None:
    root = tmp_path / "runs" / "r1"
    CheckpointStore(root).save(0, arrays_for(0), run_config=run_config)
    traced.index("fsync", root.parent)
    traced.index("fsync", tmp_path)


def test_set_aside_is_made_durable(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root)
    store.save(1, arrays_for(1), run_config=run_config)
    tracer = TracingOs()
    monkeypatch.setattr(store_mod, "os", tracer)

    moved = store.set_aside(1)

    i = tracer.index("rename", store.step_path(1), moved)
    tracer.index("fsync", root, after=i)
