"""The Flax + Optax example recovers as ``recover train`` does: a SIGTERM makes it save and
exit with 75, a SIGKILL loses at most the steps since its newest checkpoint, and either way
the rerun ends with the uninterrupted run's state digest, bit for bit."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from recovery.api import EXIT_PREEMPTED
from tests.examples.conftest import SAVE_EVERY, command, events, run, wait_for_event

# Slow enough per step that a signal lands mid-run; the reruns go at full speed.
DELAY = ["--step-delay", "0.1"]


def start(run_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(run_dir, *DELAY), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> str:
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err


@pytest.mark.slow
def test_sigterm_saves_exits_75_and_the_rerun_matches_the_control(
    tmp_path: Path, example_env: dict[str, str], control_digest: str
) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, example_env)
    wait_for_event(run_dir, "step", 12, proc)
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    (preempted,) = events(run_dir, "preempted")
    assert preempted["signal"] == "SIGTERM"
    stopped = preempted["step"]
    assert stopped >= 12
    assert [e["step"] for e in events(run_dir, "checkpoint")][-1] == stopped

    assert run(run_dir, example_env) == control_digest
    (restored,) = events(run_dir, "restored")
    assert restored["step"] == stopped  # saved at the signal: nothing recomputed


@pytest.mark.slow
def test_sigkill_restarts_from_the_newest_checkpoint_and_matches_the_control(
    tmp_path: Path, example_env: dict[str, str], control_digest: str
) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, example_env)
    wait_for_event(run_dir, "checkpoint", 2 * SAVE_EVERY, proc)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert events(run_dir, "preempted") == []
    reached = max(e["step"] for e in events(run_dir, "step"))

    assert run(run_dir, example_env) == control_digest
    (restored,) = events(run_dir, "restored")
    assert 2 * SAVE_EVERY <= restored["step"] <= reached
    assert restored["step"] % SAVE_EVERY == 0  # a periodic checkpoint, not a final save
