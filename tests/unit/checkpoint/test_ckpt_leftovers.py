"""Leftovers of interrupted saves and deletions are ignored, reported, and cleaned up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery import fsutil
from recovery.checkpoint import CheckpointStore

Commit = Callable[[int], Path]


def _interrupted_save(store: CheckpointStore, step: int, run_config: dict[str, Any]) -> Path:
    """Run a real save that dies while writing its manifest; return its temp dir."""

    def failing(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    mp = pytest.MonkeyPatch()
    mp.setattr(fsutil, "write_new", failing)
    try:
        with pytest.raises(OSError, match="No space left"):
            store.save(step, {"a": np.ones(1000), "b": np.zeros(10)}, run_config=run_config)
    finally:
        mp.undo()
    (tmp,) = store.root.glob(f".tmp-step_{step:08d}-*")
    assert sorted(p.name for p in tmp.iterdir()) == ["D00000.bin"]  # data, but no manifest
    return tmp


@pytest.fixture
def littered(commit: Commit, store: CheckpointStore, run_config: dict[str, Any]) -> list[str]:
    """Steps 4 and 8 committed, plus one leftover of each kind."""
    commit(4)
    commit(8)
    tmp = _interrupted_save(store, 12, run_config)
    trash = store.root / ".trash-step_00000002-0123456789ab"
    trash.mkdir()
    (trash / "D00000.bin").write_bytes(b"\1" * 100)
    (trash / "sub").mkdir()  # rmtree must handle nesting
    (trash / "sub" / "f").write_bytes(b"")
    manual_tmp = store.root / ".tmp-step_00000016-feedfeedfeed"
    manual_tmp.mkdir()
    (manual_tmp / "manifest.json").write_bytes(b"{}")  # even a manifest does not make it a step
    damaged = store.root / ".damaged-step_00000003-1700000000"
    damaged.mkdir()
    return sorted([tmp.name, trash.name, manual_tmp.name])


def test_leftovers_are_not_steps(littered: list[str], store: CheckpointStore) -> None:
    assert store.steps() == [4, 8]


def test_restore_ignores_leftovers(
    littered: list[str], store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    result = store.restore_latest(run_config=run_config)
    assert (result.loaded.step, result.fallbacks) == (8, [])


def test_scan_reports_leftovers_as_incomplete(littered: list[str], store: CheckpointStore) -> None:
    rows = {r.name: r for r in store.scan()}

    assert rows["step_00000008"].state == "intact"
    assert rows["step_00000004"].state == "intact"
    for name in littered:
        assert rows[name].state == "incomplete", name
        assert rows[name].step is None
        kind = "interrupted save" if name.startswith(".tmp-") else "interrupted deletion"
        assert kind in rows[name].reason
    assert rows[".damaged-step_00000003-1700000000"].state == "corrupt"
    trash = next(n for n in littered if n.startswith(".trash-"))
    assert rows[trash].size_bytes == 100
    # Steps first, newest first; then the leftovers.
    assert [r.name for r in store.scan()][:2] == ["step_00000008", "step_00000004"]


def test_remove_leftovers_deletes_only_leftovers(
    littered: list[str], store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    removed = store.remove_leftovers()

    assert removed == littered
    remaining = sorted(p.name for p in store.root.iterdir())
    assert remaining == [".damaged-step_00000003-1700000000", "step_00000004", "step_00000008"]
    assert store.remove_leftovers() == []  # idempotent
    assert store.restore_latest(run_config=run_config).loaded.step == 8


def test_remove_leftovers_on_a_missing_root(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "nope").remove_leftovers() == []
