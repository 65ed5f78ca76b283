"""``recover train`` as a real process: signals, several devices, and SIGKILL at random."""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from recovery.checkpoint import CheckpointStore
from recovery.contract.exits import EXIT_PREEMPTED
from tests.train.conftest import (
    completed_digest,
    events,
    run_cli,
    train_cmd,
    wait_for,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compilation cache for the module: restarts skip compiling, as in production."""
    return tmp_path_factory.mktemp("compile-cache")


def _control(run_dir: Path, steps: int, cache: Path, *extra: str) -> str:
    done = run_cli(train_cmd(run_dir, steps, 2, "--compile-cache", str(cache), *extra))
    assert done.returncode == 0, done.stderr
    return completed_digest(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_finishes_the_step_saves_and_exits_75(
    tmp_path: Path, cache: Path, sig: signal.Signals
) -> None:
    control = _control(tmp_path / "control", 12, cache, "--model", "mlp-small")
    run = tmp_path / "run"
    cmd = train_cmd(
        run, 12, 100, "--model", "mlp-small", "--step-sleep", "0.2", "--compile-cache", str(cache)
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(
            lambda: any(e["event"] == "step" for e in events(run)), what="the first step event"
        )
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, err
    log = events(run)
    pre = [e for e in log if e["event"] == "preempted"]
    assert len(pre) == 1
    assert pre[0]["signal"] == sig.name
    stopped_at = pre[0]["step"]
    assert 1 <= stopped_at < 12
    # The step that was running finished and was saved (save_every=100: only this save).
    assert CheckpointStore(run / "checkpoints").steps() == [stopped_at]
    done = run_cli(
        train_cmd(run, 12, 100, "--model", "mlp-small", "--resume", "--compile-cache", str(cache))
    )
    assert done.returncode == 0, done.stderr
    assert completed_digest(run) == control


@pytest.mark.slow
def test_sharded_over_four_cpu_devices_resume_is_bit_exact(tmp_path: Path, cache: Path) -> None:
    four = ("--cpu-devices", "4", "--model", "mlp-small")
    control = _control(tmp_path / "control", 6, cache, *four)
    run = tmp_path / "run"
    first = run_cli(train_cmd(run, 3, 2, "--compile-cache", str(cache), *four))
    assert first.returncode == 0, first.stderr
    second = run_cli(train_cmd(run, 6, 2, "--resume", "--compile-cache", str(cache), *four))
    assert second.returncode == 0, second.stderr
    assert completed_digest(run) == control
    started = [e for e in events(run) if e["event"] == "started"]
    assert {e["device_count"] for e in started} == {4}


def _event_or_exit(run: Path, after: int, event: str, proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``run`` logged ``event`` after its first ``after`` events, or ``proc`` ended."""
    return any(e["event"] == event for e in events(run)[after:]) or proc.poll() is not None


def _kill_loop(tmp_path: Path, cache: Path, kills: int, seed: int) -> None:
    """SIGKILL a run with a save every step at random moments, resume, repeat; then finish.

    Kills land during start-up, steps, and background saves (a save of mlp-small takes a
    few milliseconds and one starts after every step). Every restart must restore without
    a single fallback and the final state must equal the uninterrupted control's.

    How far a run gets before its kill depends on the machine's load, so no killed run may
    reach the end of training: each trains to ``steps - 1`` (the total does not enter the
    computation, so its steps are the control's), and only the last run finishes. A run that
    got there before its kill landed simply ends, and the runs after it end at once; the
    budget (six steps per kill, twice what a run makes on an idle machine) keeps that rare.
    """
    steps = 6 * kills + 6
    extra = ("--model", "mlp-small", "--step-sleep", "0.01", "--compile-cache", str(cache))
    control = _control(tmp_path / "control", steps, cache, *extra[:2])
    run = tmp_path / "run"
    rng = random.Random(seed)
    durable_before_kill = 0
    killed = 0
    for i in range(kills):
        n_before = len(events(run))
        # Half the kills aim just after a step (mostly while its save is being written), half
        # just after a checkpoint became durable (so the run also makes progress).
        target = rng.choice(["step", "checkpoint"])
        proc = subprocess.Popen(
            train_cmd(run, steps - 1, 1, "--auto-resume", *extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for(
                functools.partial(_event_or_exit, run, n_before, target, proc),
                what=f"a {target} event of run {i}",
            )
            time.sleep(rng.uniform(0.0, 0.05))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                killed += 1
                durable_before_kill += target == "checkpoint"
        finally:
            proc.kill()
            proc.wait()
            err = proc.stderr.read()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        assert proc.returncode in (0, -signal.SIGKILL), f"run {i} failed: {err!r}"
    assert killed, "no kill landed while a run was training"
    final = run_cli(train_cmd(run, steps, 1, "--auto-resume", *extra))
    assert final.returncode == 0, final.stderr
    log = events(run)
    assert not [e for e in log if e["event"] == "fallback"], "a save was not atomic"
    restored = [e for e in log if e["event"] == "restored"]
    assert len(restored) >= durable_before_kill
    assert completed_digest(run) == control


@pytest.mark.slow
def test_sigkill_at_random_moments_never_breaks_resume(tmp_path: Path, cache: Path) -> None:
    _kill_loop(tmp_path, cache, kills=6, seed=1)


@pytest.mark.slow
@pytest.mark.soak
def test_sigkill_loop_many_kills(tmp_path: Path, cache: Path) -> None:
    _kill_loop(tmp_path, cache, kills=45, seed=2)
