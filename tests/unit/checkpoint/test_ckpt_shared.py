"""Checkpoints of a job of several processes: every process writes its share of one step, the
step appears only once all shares are durable, and a restore takes the newest step that
every process verifies. The processes are threads here, joined by a real group over
loopback sockets; ``tests/train/test_multiproc*.py`` runs real processes."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore, SharedSaveError
from recovery.checkpoint import commit as commit_mod
from recovery.checkpoint import format as fmt
from recovery.errors import ConfigMismatchError, NoAgreedCheckpointError, NoCheckpointError
from recovery.multiproc import Group
from tests.unit.checkpoint.conftest import RUN_CONFIG, ArraysFor, AssertSame
from tests.unit.multiproc.helpers import form_group, on_all


@pytest.fixture
def group3() -> Iterator[list[Group]]:
    groups, losses = form_group(3)
    yield groups
    assert not losses
    for g in groups:
        g.abort("test over")


def _save_all(
    groups: list[Group],
    stores: list[CheckpointStore],
    step: int,
    arrays: dict[str, np.ndarray],
    index: int = 1,
    key_impls: dict[str, str] | None = None,
) -> list[Any]:
    def save(g: Group) -> Any:
        try:
            return stores[g.rank].save_shared(
                step,
                arrays,
                peers=g.channel("save"),
                save_index=index,
                run_config=RUN_CONFIG,
                metadata={"data_position": step, "processes": g.size},
                key_impls=key_impls,
            )
        except SharedSaveError as e:
            return e

    return on_all(groups, save)


def test_three_processes_save_one_step_with_one_manifest(
    group3: list[Group],
    root: Path,
    arrays_for: ArraysFor,
    assert_same: AssertSame,
    tmp_path: Path,
) -> None:
    stores = [CheckpointStore(root) for _ in group3]
    results = _save_all(group3, stores, 8, arrays_for(8))
    assert {r.state_digest for r in results} == {results[0].state_digest}
    # The digest is the state's, whoever wrote which file: a single process agrees.
    alone = CheckpointStore(tmp_path / "alone").save(8, arrays_for(8), run_config=RUN_CONFIG)
    assert results[0].state_digest == alone.state_digest
    step_dir = root / "step_00000008"
    names = sorted(p.name for p in step_dir.iterdir())
    assert names == ["D00000.bin", "D00001.bin", "D00002.bin", fmt.MANIFEST]
    loaded = CheckpointStore(root).load(8, run_config=RUN_CONFIG)
    assert_same(loaded.arrays, arrays_for(8))
    assert loaded.manifest.metadata == {"data_position": 8, "processes": 3}
    assert not [p for p in root.iterdir() if p.name.startswith(fmt.TMP_PREFIX)]


def test_key_implementations_are_in_the_one_manifest(
    group3: list[Group], root: Path, arrays_for: ArraysFor, tmp_path: Path
) -> None:
    keyed = {"params/b": "rbg"}  # the store records what it is told; JAX is not involved
    results = _save_all(group3, [CheckpointStore(root) for _ in group3], 8, arrays_for(8), 1, keyed)
    alone = CheckpointStore(tmp_path / "alone").save(
        8, arrays_for(8), run_config=RUN_CONFIG, key_impls=keyed
    )
    assert {r.state_digest for r in results} == {alone.state_digest}
    assert CheckpointStore(root).load(8).key_impls == keyed


def test_a_process_that_cannot_write_fails_the_save_everywhere(
    group3: list[Group], root: Path, arrays_for: ArraysFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = [CheckpointStore(root) for _ in group3]
    _save_all(group3, stores, 4, arrays_for(4))
    real = commit_mod.write_files

    def failing(tmp: Path, views: Any, plan: Any, files: Any, *, workers: int) -> Any:
        if 1 in files:  # process 1's share (files 1, 4, ...)
            raise OSError(28, "No space left on device")
        return real(tmp, views, plan, files, workers=workers)

    monkeypatch.setattr(commit_mod, "write_files", failing)
    errors = _save_all(group3, stores, 8, arrays_for(8), index=2)
    assert all(isinstance(e, SharedSaveError) for e in errors)
    assert {str(e) for e in errors} == {
        "step 8 not saved: process 1: OSError: [Errno 28] No space left on device"
    }
    assert CheckpointStore(root).steps() == [4]  # nothing committed, the older step intact
    assert [p.name.startswith(fmt.TMP_PREFIX) for p in root.iterdir() if p.is_dir()].count(True)


def test_no_step_appears_until_every_share_is_durable(
    group3: list[Group], root: Path, arrays_for: ArraysFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process 2 is slow to write: processes 0 and 1 are done, yet step_N does not exist."""
    release, others_done = threading.Event(), threading.Barrier(3)
    real = commit_mod.write_files

    def slow(tmp: Path, views: Any, plan: Any, files: Any, *, workers: int) -> Any:
        if 2 in files:
            assert release.wait(10)
            return real(tmp, views, plan, files, workers=workers)
        written = real(tmp, views, plan, files, workers=workers)
        others_done.wait(10)  # with the other fast process and the test
        return written

    monkeypatch.setattr(commit_mod, "write_files", slow)
    stores = [CheckpointStore(root) for _ in group3]
    saving = threading.Thread(target=_save_all, args=(group3, stores, 8, arrays_for(8)))
    saving.start()
    others_done.wait(10)
    tmp = [p for p in root.iterdir() if p.name.startswith(fmt.TMP_PREFIX)]
    assert len(tmp) == 1
    assert sorted(p.name for p in tmp[0].iterdir()) == ["D00000.bin", "D00001.bin"]
    assert CheckpointStore(root).steps() == []
    release.set()
    saving.join(20)
    assert CheckpointStore(root).steps() == [8]


def _views(tmp_path: Path, source: Path, n: int) -> list[CheckpointStore]:
    """One copy of ``source`` per process: how each process's view of the shared root may
    differ (a read error on one node, a copy it cannot see)."""
    out = []
    for r in range(n):
        view = tmp_path / f"view{r}"
        shutil.copytree(source, view)
        out.append(CheckpointStore(view))
    return out


def _restore_all(
    groups: list[Group], stores: list[CheckpointStore], config: Any = None
) -> list[Any]:
    def restore(g: Group) -> Any:
        try:
            return stores[g.rank].restore_agreed(
                peers=g.channel("main"), run_config=config or RUN_CONFIG
            )
        except Exception as e:
            return e

    return on_all(groups, restore)


def test_the_newest_step_every_process_verifies_is_restored(
    group3: list[Group], root: Path, commit: Any, tmp_path: Path
) -> None:
    for step in (4, 8, 12):
        commit(step)
    stores = _views(tmp_path, root, 3)
    data = stores[1].root / "step_00000012" / "D00000.bin"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0xFF
    data.write_bytes(bytes(raw))  # damaged for process 1 only
    (stores[2].root / "step_00000012" / "D00000.bin").unlink()  # missing for process 2
    results = _restore_all(group3, stores)
    assert {r.loaded.step for r in results} == {8}
    assert {r.loaded.state_digest for r in results} == {results[0].loaded.state_digest}
    ((step, why),) = results[0].fallbacks
    assert step == 12
    assert "process 1: leaf" in why
    assert "content digest mismatch" in why
    assert "process 2: data file D00000.bin is missing" in why
    assert "process 0" not in why


def test_when_no_step_verifies_for_all_the_error_names_every_refusal(
    group3: list[Group], root: Path, commit: Any, tmp_path: Path
) -> None:
    commit(4)
    commit(8)
    stores = _views(tmp_path, root, 3)
    shutil.rmtree(stores[0].root / "step_00000008")  # process 0 does not see step 8
    (stores[2].root / "step_00000004" / fmt.MANIFEST).write_text("{}")
    errors = _restore_all(group3, stores)
    assert all(isinstance(e, NoAgreedCheckpointError) for e in errors)
    text = str(errors[0])
    assert "step 8: process 0: step_00000008 is missing" in text
    assert "step 4: process 2: manifest format is None" in text
    assert [s for s, _ in errors[0].refusals] == [8, 4]


def test_another_configuration_is_refused_on_every_process(
    group3: list[Group], root: Path, commit: Any, tmp_path: Path
) -> None:
    commit(4)
    errors = _restore_all(group3, _views(tmp_path, root, 3), {**RUN_CONFIG, "lr": 1.0})
    assert all(isinstance(e, ConfigMismatchError) for e in errors)


def test_nothing_to_restore(group3: list[Group], tmp_path: Path) -> None:
    errors = _restore_all(group3, [CheckpointStore(tmp_path / "none")] * 3)
    assert all(isinstance(e, NoCheckpointError) for e in errors)


def test_a_single_process_checkpoint_restores_with_several(
    group3: list[Group], root: Path, commit: Any, arrays_for: ArraysFor, assert_same: AssertSame
) -> None:
    """The format is the same: one data file, written by one process, restores anywhere."""
    commit(8)
    results = _restore_all(group3, [CheckpointStore(root)] * 3)
    for r in results:
        assert r.loaded.step == 8
        assert_same(r.loaded.arrays, arrays_for(8))
