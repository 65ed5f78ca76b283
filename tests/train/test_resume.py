"""Bit-exact resume and the checkpoint errors of ``recover train`` (real JAX, in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery.errors import (
    CheckpointExistsError,
    ConfigMismatchError,
    NoCheckpointError,
    StepBehindError,
    UsageError,
)
from recovery.events import EVENTS
from recovery.train.loop import ResumeMode, TrainOptions, run_training
from tests.train.conftest import events

STEPS = 8


def _opts(run_dir: Path, steps: int, **kw: object) -> TrainOptions:
    base: dict[str, object] = {"save_every": 3, "model": "mlp-tiny", "seed": 7}
    base.update(kw)
    return TrainOptions(run_dir=run_dir, steps=steps, **base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Digest of an uninterrupted 8-step run."""
    out = run_training(_opts(tmp_path_factory.mktemp("control"), STEPS), handle_signals=False)
    assert out.updates == STEPS
    return out.state_digest


@pytest.mark.parametrize("first", [1, 3, 4, 7])
def test_resume_is_bit_exact_whatever_the_interruption_point(
    tmp_path: Path, control: str, first: int
) -> None:
    a = run_training(_opts(tmp_path, first), handle_signals=False)
    assert a.step == first
    assert a.state_digest != control
    b = run_training(_opts(tmp_path, STEPS, resume=ResumeMode.required), handle_signals=False)
    assert b.updates == STEPS - first
    assert b.state_digest == control
    log = events(tmp_path)
    restored = [e for e in log if e["event"] == "restored"]
    assert restored[-1]["checkpoint_step"] == first
    assert restored[-1]["data_position"] == first
    # Across both processes each data position was consumed exactly once, in order.
    positions = [e["data_position"] for e in log if e["event"] == "step"]
    assert positions == list(range(STEPS))


def test_resume_from_a_periodic_checkpoint_recomputes_the_lost_steps(
    tmp_path: Path, control: str
) -> None:
    run_training(_opts(tmp_path, 5), handle_signals=False)  # saves 3 and 5
    # Simulate a crash after step 5 was computed but before it was saved.
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step_00000005")
    b = run_training(_opts(tmp_path, STEPS, resume=ResumeMode.auto), handle_signals=False)
    assert b.updates == STEPS - 3
    assert b.state_digest == control


def test_resuming_a_completed_run_runs_no_update(tmp_path: Path, control: str) -> None:
    run_training(_opts(tmp_path, STEPS), handle_signals=False)
    n_before = len(events(tmp_path))
    again = run_training(_opts(tmp_path, STEPS, resume=ResumeMode.required), handle_signals=False)
    assert again.updates == 0
    assert again.state_digest == control
    new = [e["event"] for e in events(tmp_path)[n_before:]]
    assert new == ["started", "restored", "completed"]


def test_events_have_the_documented_fields(tmp_path: Path) -> None:
    run_training(
        _opts(tmp_path, 4, save_every=2),
        environ={"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "3"},
        handle_signals=False,
    )
    log = events(tmp_path)
    kinds = [e["event"] for e in log]
    assert kinds[:2] == ["started", "warmup"]
    assert kinds[-1] == "completed"
    assert set(kinds) <= EVENTS
    for e in log:
        assert isinstance(e["ts"], float)
        assert "step" in e
        assert e["slurm_job_id"] == "42"
        assert e["restart_count"] == 3
    started = log[0]
    assert started["backend"] == "cpu"
    assert started["device_count"] >= 1
    steps = [e for e in log if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    assert all(e["loss"] > 0 and e["step_s"] > 0 for e in steps)
    ckpts = sorted(e["checkpoint_step"] for e in log if e["event"] == "checkpoint")
    assert ckpts == [2, 4]
    final = next(e for e in log if e["event"] == "checkpoint" and e["checkpoint_step"] == 4)
    assert final["state_digest"] == log[-1]["state_digest"]
    assert "warmup_s" in log[1]


def test_the_progress_record_follows_the_run(tmp_path: Path) -> None:
    """What the job's watcher reads: each step as it finishes, the saves and the restore as
    phases (not steps), and the clean end."""
    from recovery.progress import Phase, read_records

    run_training(
        _opts(tmp_path, 6, save_every=2), environ={"SLURMD_NODENAME": "nodeX"}, handle_signals=False
    )
    (record,) = read_records(tmp_path / "progress").values()
    assert (record.rank, record.size, record.node, record.pid) == (0, 1, "nodeX", os.getpid())
    assert (record.phase, record.step_started, record.step_finished) == (Phase.done, 6, 6)
    step_s = [e["step_s"] for e in events(tmp_path) if e["event"] == "step"]
    assert 0 < record.last_step_s < 60
    assert record.last_step_s >= step_s[-1]  # from the step before's end: the loop's whole turn


def test_fresh_run_refuses_to_overwrite_checkpoints(tmp_path: Path) -> None:
    run_training(_opts(tmp_path, 2), handle_signals=False)
    with pytest.raises(CheckpointExistsError, match=r"newest step 2.*--resume"):
        run_training(_opts(tmp_path, 4), handle_signals=False)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoCheckpointError, match="holds no checkpoint"):
        run_training(_opts(tmp_path, 4, resume=ResumeMode.required), handle_signals=False)


def test_auto_resume_without_checkpoint_starts_fresh(tmp_path: Path, control: str) -> None:
    out = run_training(_opts(tmp_path, STEPS, resume=ResumeMode.auto), handle_signals=False)
    assert out.state_digest == control


def test_final_step_behind_the_checkpoint_is_refused(tmp_path: Path) -> None:
    run_training(_opts(tmp_path, 6), handle_signals=False)
    with pytest.raises(StepBehindError, match=r"--steps 4 is behind .*step 6"):
        run_training(_opts(tmp_path, 4, resume=ResumeMode.required), handle_signals=False)


def test_changed_configuration_names_the_fields_and_both_values(tmp_path: Path) -> None:
    run_training(_opts(tmp_path, 2), handle_signals=False)
    with pytest.raises(ConfigMismatchError) as info:
        run_training(_opts(tmp_path, 4, lr=0.01, resume=ResumeMode.required), handle_signals=False)
    msg = str(info.value)
    assert "lr: checkpoint has 0.001, this run has 0.01" in msg
    assert "seed" not in msg


def test_damaged_newest_checkpoint_falls_back_and_still_matches_control(
    tmp_path: Path, control: str
) -> None:
    run_training(_opts(tmp_path, 6), handle_signals=False)  # saves 3 and 6
    leaf = sorted((tmp_path / "checkpoints" / "step_00000006").glob("D*.bin"))[0]
    data = bytearray(leaf.read_bytes())
    data[len(data) // 2] ^= 0x01
    leaf.write_bytes(bytes(data))
    out = run_training(_opts(tmp_path, STEPS, resume=ResumeMode.required), handle_signals=False)
    assert out.state_digest == control
    assert out.updates == STEPS - 3
    fallback = [e for e in events(tmp_path) if e["event"] == "fallback"]
    assert len(fallback) == 1
    assert fallback[0]["step"] == 6
    assert "digest mismatch" in fallback[0]["reason"]
    # The damaged step is kept aside for inspection, not deleted.
    assert (tmp_path / "checkpoints" / fallback[0]["moved_to"]).is_dir()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"steps": 0}, "--steps must be >= 1"),
        ({"save_every": 0}, "--save-every must be >= 1"),
        ({"model": "gpt-9"}, "Unknown model 'gpt-9'. Known: mlp-1g, mlp-medium"),
        ({"lr": -1.0}, "--lr must be a positive"),
        ({"memory_budget": 0.0}, r"--memory-budget must be a share of the time in \(0, 1\]"),
        ({"memory_budget": 1.5}, r"--memory-budget must be a share .* \(got 1.5\)"),
    ],
)
def test_bad_options_name_what_is_valid(
    tmp_path: Path, kw: dict[str, object], message: str
) -> None:
    base: dict[str, object] = {"steps": 4}
    base.update(kw)
    steps = int(base.pop("steps"))  # type: ignore[call-overload]
    with pytest.raises(UsageError, match=message):
        run_training(_opts(tmp_path, steps, **base), handle_signals=False)
    assert not (tmp_path / "checkpoints").exists() or not any(
        (tmp_path / "checkpoints").glob("step_*")
    )
