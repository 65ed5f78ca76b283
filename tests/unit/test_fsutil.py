"""recovery.fsutil: the order of a durable write, recorded through a stand-in for ``os``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from recovery import fsutil
from tests.unit.conftest import TracingOs


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> TracingOs:
    tracer = TracingOs()
    monkeypatch.setattr(fsutil, "os", tracer)
    return tracer


@pytest.mark.parametrize("existing", [None, b"old content, longer than the new one"])
def test_atomic_write_fsyncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, traced: TracingOs, existing: bytes | None
) -> None:
    target = tmp_path / "state.json"
    if existing is not None:
        target.write_bytes(existing)

    fsutil.atomic_write(target, b'{"new": true}\n')

    ((i_rename, tmp),) = [
        (i, src)
        for i, (op, src, dst) in enumerate(traced.trace)
        if op == "rename" and dst == target
    ]
    assert tmp.parent == tmp_path, "the temporary file must be a sibling (same file system)"
    assert tmp != target
    i_open = traced.index("open", tmp)
    assert traced.index("fsync", tmp, after=i_open) < i_rename, "file not durable before rename"
    traced.index("fsync", tmp_path, after=i_rename)  # the rename itself is made durable
    assert target.read_bytes() == b'{"new": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


class _FailingRename:
    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def rename(self, src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device (injected)")


def test_a_failed_atomic_write_keeps_the_old_content_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    monkeypatch.setattr(fsutil, "os", _FailingRename())

    with pytest.raises(OSError, match="injected"):
        fsutil.atomic_write(target, b"new")

    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_write_new_fsyncs_and_refuses_to_overwrite(tmp_path: Path, traced: TracingOs) -> None:
    path = tmp_path / "manifest.json"
    fsutil.write_new(path, b"x" * 10)
    assert traced.index("fsync", path) > traced.index("open", path)
    assert path.read_bytes() == b"x" * 10
    with pytest.raises(FileExistsError):
        fsutil.write_new(path, b"other")
    assert path.read_bytes() == b"x" * 10


def test_fsync_dir_of_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fsutil.fsync_dir(tmp_path / "absent")
