"""Crash consistency: whatever instant a save is interrupted at, the newest durable step restores.

Two complementary checks:

* in-process: a stand-in for ``os`` (in every module of the save protocol: ``files``,
  ``fsutil`` and ``commit``) aborts the save at its n-th system call, for every n, so every
  crash point of one save (with retention, or replacing a step) is visited deterministically;
* real processes: a child saves in a loop and is SIGKILLed at seeded random moments.
"""

from __future__ import annotations

import random
import runpy
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore, RetentionPolicy, RunLock
from recovery.checkpoint import format as fmt
from tests.helpers import Crash, CrashingOs, kill_and_drain
from tests.unit.checkpoint.conftest import patch_os

AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]
ArraysFor = Callable[[int], dict[str, np.ndarray]]
SplitInto = Callable[[int], None]

CHILD = Path(__file__).with_name("crash_child.py")
_child = runpy.run_path(str(CHILD))
content: Callable[[int], dict[str, np.ndarray]] = _child["content"]
CHILD_CONFIG: dict[str, Any] = _child["RUN_CONFIG"]
KEEP_LAST: int = _child["KEEP_LAST"]


# --- in-process: every crash point of one save -----------------------------------------------


def _setup(root: Path, arrays_for: ArraysFor, run_config: dict[str, Any]) -> CheckpointStore:
    store = CheckpointStore(root, workers=1, retention=RetentionPolicy(keep_last=2))
    for s in (1, 2, 3):
        store.save(s, arrays_for(s), run_config=run_config)
    return store


def _copy_of(template: Path, root: Path) -> CheckpointStore:
    shutil.copytree(template, root)  # cheaper than three fsynced saves per crash point
    return CheckpointStore(root, workers=1, retention=RetentionPolicy(keep_last=2))


@pytest.mark.parametrize("files", [1, 3])
def test_every_crash_point_of_a_save_leaves_a_restorable_run(
    tmp_path: Path,
    arrays_for: ArraysFor,
    assert_same: AssertSame,
    run_config: dict[str, Any],
    split_into: SplitInto,
    monkeypatch: pytest.MonkeyPatch,
    files: int,
) -> None:
    split_into(files)  # with workers=1 the files are written one after the other
    # Count the system calls of one complete save (step 4, which also retires step 2).
    template = _setup(tmp_path / "template", arrays_for, run_config).root
    counter = CrashingOs(at=None)
    store = _copy_of(template, tmp_path / "count")
    with monkeypatch.context() as mp:
        patch_os(mp, counter)
        store.save(4, arrays_for(4), run_config=run_config)
    total = counter.calls
    assert len(store.load(4).manifest.files) == files
    assert total > 10 + 4 * files

    outcomes = set()
    for at in range(total):
        store = _copy_of(template, tmp_path / f"crash{at}")
        with monkeypatch.context() as mp:
            patch_os(mp, CrashingOs(at))
            with pytest.raises(Crash):
                store.save(4, arrays_for(4), run_config=run_config)

        # "Restart": a fresh store object on the same directory.
        after = CheckpointStore(store.root, retention=RetentionPolicy(keep_last=2))
        result = after.restore_latest(run_config=run_config)
        assert result.fallbacks == [], f"crash at #{at} left a damaged step"
        assert result.loaded.step in (3, 4)
        assert_same(result.loaded.arrays, arrays_for(result.loaded.step))
        outcomes.add(result.loaded.step)
        after.remove_leftovers()
        names = sorted(p.name for p in after.root.iterdir())
        assert all(fmt.parse_step_dir(n) is not None for n in names), names
        # The resumed run saves on; retention catches up.
        after.save(5, arrays_for(5), run_config=run_config)
        assert after.steps() == [result.loaded.step, 5]
    assert outcomes == {3, 4}, "the crash points should straddle the commit"


def test_every_crash_point_of_replacing_a_step_keeps_that_step(
    tmp_path: Path,
    arrays_for: ArraysFor,
    assert_same: AssertSame,
    run_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Step 3 is saved again with other content (as when a damaged step is overwritten).
    template = _setup(tmp_path / "template", arrays_for, run_config).root
    counter = CrashingOs(at=None)
    with monkeypatch.context() as mp:
        patch_os(mp, counter)
        _copy_of(template, tmp_path / "count").save(3, arrays_for(30), run_config=run_config)
    assert counter.calls > 10

    lost = []
    for at in range(counter.calls):
        store = _copy_of(template, tmp_path / f"crash{at}")
        with monkeypatch.context() as mp:
            patch_os(mp, CrashingOs(at))
            with pytest.raises(Crash):
                store.save(3, arrays_for(30), run_config=run_config)

        after = CheckpointStore(store.root, retention=RetentionPolicy(keep_last=2))
        after.remove_leftovers()  # what the next training run does first, under the lock
        result = after.restore_latest(run_config=run_config)
        assert result.fallbacks == [], f"crash at #{at} left a damaged step"
        if result.loaded.step != 3:
            lost.append(at)
            continue
        want = arrays_for(30) if result.loaded.arrays["opt/count"] == 30 else arrays_for(3)
        assert_same(result.loaded.arrays, want)
    assert lost == [], f"crashes at calls {lost} lost step 3"


# --- real processes, SIGKILLed ---------------------------------------------------------------


def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        stderr = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"child exited early with status {proc.returncode}:\n{stderr}")
    return line


def _kill_loop(root: Path, kills: int, seed: int) -> list[int]:
    """SIGKILL a saving child ``kills`` times; check the run after each kill."""
    rng = random.Random(seed)
    store = CheckpointStore(root, retention=RetentionPolicy(keep_last=KEEP_LAST))
    store.save(0, content(0), run_config=CHILD_CONFIG, metadata={"step": 0})
    durable = 0  # newest step the child reported as saved: must never be lost
    # Most step directories there may be: a save that returned ran retention (KEEP_LAST
    # left); each kill between a commit and its retention adds one, until a save returns.
    bound = KEEP_LAST
    restored_steps = []
    for kill in range(kills):
        resumed_from = durable
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert _read_line(proc).split() == ["ready", str(durable)]
            # Let a random number of saves complete, then kill at a random instant after
            # that: sometimes mid-write, mid-retention, or right between two saves.
            for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
                word, saved = _read_line(proc).split()
                assert word == "saved"
                durable = int(saved)
            time.sleep(rng.uniform(0.0, 0.06))
        finally:
            out, err = kill_and_drain(proc)
        assert proc.returncode == -signal.SIGKILL, err
        for line in out.splitlines():  # saves that finished after the last line we read
            durable = int(line.split()[1])
        bound = KEEP_LAST + 1 if durable > resumed_from else bound + 1

        with RunLock(root).held():  # free again: the kernel dropped the dead child's lock
            result = store.restore_latest(run_config=CHILD_CONFIG)
            step = result.loaded.step
            assert result.fallbacks == [], f"kill {kill}: a committed step was damaged"
            assert step >= durable, f"kill {kill}: step {durable} was reported durable"
            assert step <= durable + 1, f"kill {kill}: step {step} was never started"
            assert result.loaded.manifest.metadata == {"step": step}
            loaded = result.loaded.arrays
            want = content(step)
            assert sorted(loaded) == sorted(want)
            for name, a in want.items():
                assert loaded[name].dtype == a.dtype, name
                assert np.array_equal(loaded[name], a), name
            assert len(store.steps()) <= bound, f"kill {kill}: retention fell behind"
            store.remove_leftovers()
            assert sorted(p.name for p in root.iterdir() if p.name != ".lock") == [
                fmt.step_dir_name(s) for s in store.steps()
            ]
        durable = step  # the next child resumes from here
        restored_steps.append(step)
    return restored_steps


def test_sigkill_during_saves_never_loses_a_durable_step(tmp_path: Path) -> None:
    steps = _kill_loop(tmp_path / "run", kills=8, seed=1234)
    assert steps == sorted(steps)
    assert steps[-1] > 0, "the children should have committed something"


@pytest.mark.slow
@pytest.mark.soak
def test_sigkill_during_saves_many_times(tmp_path: Path) -> None:
    steps = _kill_loop(tmp_path / "run", kills=48, seed=2024)
    assert steps == sorted(steps)
    assert steps[-1] >= 10
