"""The checkpoint manager on plain JAX and numpy states: save, restore, fallback, retention,
read-only use, the run lock, and the events the run report reads."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from recovery.api import (
    CheckpointDamaged,
    CheckpointManager,
    ConfigMismatchError,
    NoCheckpointError,
    RunLockedError,
    UsageError,
    open_event_log,
    read_events,
)
from recovery.checkpoint import CheckpointStore, RunLock
from recovery.checkpoint import format as fmt
from tests.api.helpers import leaves_equal
from tests.helpers import flip_a_byte


def state(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "params": {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32), "b": jnp.zeros(3)},
        "opt": (jnp.int32(seed), {"mu": jnp.asarray(rng.standard_normal(3), jnp.float32)}),
    }


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_save_restore_roundtrip(tmp_path: Path, async_save: bool) -> None:
    with CheckpointManager(tmp_path, async_save=async_save, run_config={"seed": 1}) as mgr:
        result = mgr.save(5, state(5), metadata={"data_position": 50, "note": "x"})
        assert (result is None) is async_save
        done = mgr.wait()
        assert done is not None
        assert done.step == 5
    with CheckpointManager(tmp_path, run_config={"seed": 1}) as mgr:
        restored = mgr.restore(state(0))
    assert restored.step == 5
    assert leaves_equal(restored.state, state(5))
    assert not leaves_equal(restored.state, state(0))  # the check can fail
    assert restored.metadata == {"data_position": 50, "note": "x"}
    assert restored.state_digest == done.state_digest
    assert restored.skipped == ()


def test_restore_falls_back_past_a_damaged_step_and_says_why(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with CheckpointManager(run / "checkpoints", async_save=False) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state(s))
    flip_a_byte(run / "checkpoints", 3)
    events = open_event_log(run, environ={})
    with CheckpointManager(run / "checkpoints", events=events) as mgr:
        restored = mgr.restore(state(0))
    events.close()
    assert restored.step == 2
    assert leaves_equal(restored.state, state(2))
    (skipped,) = restored.skipped
    assert skipped.step == 3
    assert "digest" in skipped.reason
    assert skipped.moved_to is not None
    assert skipped.moved_to.startswith(".damaged-step_")
    assert (run / "checkpoints" / skipped.moved_to).is_dir()
    logged = list(read_events(run / "events.jsonl"))
    assert [e["event"] for e in logged] == ["fallback", "restored"]
    assert logged[0]["step"] == 3
    assert logged[0]["moved_to"] == skipped.moved_to
    assert logged[1]["step"] == 2
    assert logged[1]["fallbacks"] == 1
    assert logged[1]["state_digest"] == restored.state_digest


def test_read_only_manager_reports_damage_and_changes_nothing(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    flip_a_byte(tmp_path, 2)
    before = sorted(p.name for p in tmp_path.iterdir())
    # A writer holds the run lock meanwhile: a reader must not need it.
    with RunLock(tmp_path).held():
        reader = CheckpointManager(tmp_path, read_only=True)
        restored = reader.restore(state(0))
        assert restored.step == 1
        assert restored.skipped[0].moved_to is None
        with pytest.raises(UsageError, match="read-only"):
            reader.save(3, state(3))
        with pytest.raises(CheckpointDamaged, match="digest"):
            reader.verify(2)
        assert reader.verify(1).step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_restore_exact_step_and_unknown_step(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False, keep_last=None) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state(s))
        assert leaves_equal(mgr.restore(state(0), step=2).state, state(2))
        with pytest.raises(UsageError, match=r"Unknown step 7 .*Known: 1, 2, 3"):
            mgr.restore(state(0), step=7)
        info = mgr.info(3)
        assert info.step == 3
        assert info.leaves == 4
        assert info.state_digest == mgr.verify(3).state_digest
        assert mgr.restore_arrays(step=1).state["params/w"].shape == (4, 3)


def test_retention_keeps_the_newest_and_the_milestones(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, keep_last=2, keep_every=4, async_save=True) as mgr:
        for s in range(1, 10):
            mgr.save(s, state(s))
        mgr.wait()
        assert mgr.steps() == [4, 8, 9]
        assert mgr.latest_step() == 9
    statuses = CheckpointManager(tmp_path, read_only=True).status(deep=True)
    assert [s.step for s in statuses] == [9, 8, 4]
    assert {s.state for s in statuses} == {"intact"}


def test_fresh_directory_restores_none_and_refuses_a_plain_restore(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "new") as mgr:
        assert mgr.restore_or_none(state(0)) is None
        with pytest.raises(NoCheckpointError):
            mgr.restore(state(0))


def test_another_run_configuration_is_refused(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, run_config={"lr": 0.1}, async_save=False) as mgr:
        mgr.save(1, state(1))
    with (
        CheckpointManager(tmp_path, run_config={"lr": 0.2}) as mgr,
        pytest.raises(ConfigMismatchError, match="lr"),
    ):
        mgr.restore(state(0))


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as first:
        first.save(1, state(1))
        second = CheckpointManager(tmp_path)
        with pytest.raises(RunLockedError, match="in use"):
            second.save(2, state(2))
    with CheckpointManager(tmp_path, async_save=False) as again:  # released on close
        again.save(2, state(2))


def test_open_takes_the_run_before_anything_is_logged(tmp_path: Path) -> None:
    # What a loop does first: open, then log `started`. A second writer stops at the lock,
    # so the log never shows a process that did not run.
    with CheckpointManager(tmp_path, async_save=False) as first:
        first.save(1, state(1))
    leftover = f"{fmt.TMP_PREFIX}step_00000002-0123456789ab"
    (tmp_path / leftover).mkdir()  # a save interrupted by a kill
    events = open_event_log(tmp_path, environ={})
    with CheckpointManager(tmp_path, events=events) as mgr:
        assert mgr.open() == [leftover]
        assert not (tmp_path / leftover).exists()
        events.emit("started", step=None)
        with CheckpointManager(tmp_path) as second, pytest.raises(RunLockedError, match="in use"):
            second.open()
        assert mgr.open() == []  # already the writer: nothing happens
        assert mgr.restore_or_none(state(0)) is not None
    assert [e["event"] for e in read_events(tmp_path / "events.jsonl")] == ["started", "restored"]
    with pytest.raises(UsageError, match="read-only"):
        CheckpointManager(tmp_path, read_only=True).open()


def test_async_save_keeps_the_state_as_it_was_when_saved(tmp_path: Path) -> None:
    # The caller updates a numpy leaf in place right after save() returns; the checkpoint
    # must hold the value at save time.
    buf = np.arange(1 << 20, dtype=np.float32)
    with CheckpointManager(tmp_path, async_save=True) as mgr:
        mgr.save(1, {"buf": buf})
        buf[:] = -1.0
    restored = CheckpointManager(tmp_path, read_only=True).restore_arrays()
    np.testing.assert_array_equal(restored.state["buf"], np.arange(1 << 20, dtype=np.float32))


@pytest.mark.parametrize("call", ["restore", "restore_or_none", "restore_arrays"])
def test_a_restore_right_after_an_async_save_reads_that_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # The background write made slow: a restore that did not wait for it would find no
    # checkpoint (what a clean venv's quick save-then-restore hit now and then).
    slow_save = CheckpointStore.save

    def save(self: CheckpointStore, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return slow_save(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointStore, "save", save)
    with CheckpointManager(tmp_path, async_save=True) as mgr:
        mgr.save(1, state(1))
        got = mgr.restore_arrays() if call == "restore_arrays" else getattr(mgr, call)(state(0))
        assert got is not None
        assert got.step == 1


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=True) as mgr:
        with pytest.raises(UsageError, match=r"leaf 'name' is a str"):
            mgr.save(1, {"name": "adam", "w": jnp.ones(2)})
        with pytest.raises(UsageError, match=r"two leaves .* 'a/b'"):
            mgr.save(1, {"a/b": jnp.ones(1), "a": {"b": jnp.ones(1)}})
        with pytest.raises(UsageError, match="metadata must be plain JSON"):
            mgr.save(1, {"w": jnp.ones(2)}, metadata={"when": object()})
        with pytest.raises(UsageError, match="step must be >= 0"):
            mgr.save(-1, {"w": jnp.ones(2)})
        assert mgr.wait() is None
    assert mgr.steps() == []


def test_template_mismatch_names_the_leaf(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, state(1))
        other = state(0)
        other["params"]["w"] = jnp.zeros((4, 4))
        with pytest.raises(Exception, match=r"params/w is float32\[4, 3\].*float32\[4, 4\]"):
            mgr.restore(other)


def test_checkpoint_events_carry_what_the_report_reads(tmp_path: Path) -> None:
    events = open_event_log(tmp_path, environ={"SLURM_JOB_ID": "17", "SLURM_RESTART_COUNT": "2"})
    with CheckpointManager(tmp_path / "checkpoints", events=events, keep_last=1) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    events.close()
    logged = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint"]
    assert [e["step"] for e in logged] == [1, 2]
    for e in logged:
        assert {"ts", "save_s", "blocked_s", "state_digest", "bytes"} <= set(e)
        assert e["slurm_job_id"] == "17"
        assert e["restart_count"] == 2
    assert logged[1]["deleted_steps"] == [1]


def test_importing_the_api_imports_no_jax() -> None:
    code = (
        "import sys, json, recovery.api as api; "
        "print(json.dumps([m for m in ('jax', 'jaxlib', 'flax', 'optax', 'orbax') "
        "if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []
