"""One suite of checkpoint behaviour, held against both trainers the project ships: ``recover
train`` and a plain user loop on ``recovery.api`` (``user_loop.py``). Both save through the
library's :class:`~recovery.api.CheckpointManager`, so a fix made for one reaches the other;
these tests keep it that way.

Each behaviour runs real processes: saving on the interval and resuming to the same state
(background and synchronous saves), retention, falling back from a damaged newest
checkpoint, preemption (save, exit 75, continue), and a restore that two processes agree on.
A trainer's runs are compared with its own uninterrupted control run: equal state digests
mean bit-identical states.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recovery.checkpoint import CheckpointStore
from recovery.contract.exits import EXIT_PREEMPTED
from recovery.events import read_events
from tests.helpers import RECOVER, flip_a_byte
from tests.train import multi
from tests.train.conftest import wait_for

USER_LOOP = Path(__file__).resolve().parent / "user_loop.py"
TRAINERS = ("recover-train", "user-loop")
#: Steps of every run here (a control run of each trainer is made once per session).
STEPS = 8


def command(
    trainer: str,
    run_dir: Path,
    cache: Path,
    *,
    steps: int = STEPS,
    save_every: int = 2,
    keep_last: int = 3,
    sync: bool = False,
    step_sleep: float = 0.0,
) -> list[str]:
    common = [
        "--run-dir", str(run_dir), "--steps", str(steps), "--save-every", str(save_every),
        "--keep-last", str(keep_last), *(["--sync-save"] if sync else []),
        *(["--step-sleep", f"{step_sleep:g}"] if step_sleep else []),
    ]  # fmt: skip
    if trainer == "recover-train":
        return [*RECOVER, "train", *common, "--auto-resume", "--compile-cache", str(cache)]
    return [sys.executable, str(USER_LOOP), *common]


def env(cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def run(argv: list[str], cache: Path, *, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, env=env(cache), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == expect, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


def events(run_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    found = list(read_events(path)) if path.exists() else []
    return [e for e in found if name is None or e["event"] == name]


def digest(run_dir: Path) -> str:
    done = events(run_dir, "completed")
    assert done, f"no completed event in {run_dir}"
    return str(done[-1]["state_digest"])


def kept(run_dir: Path) -> list[int]:
    return CheckpointStore(run_dir / "checkpoints").steps()


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compilation cache: later runs of a program skip compiling, as in production."""
    return tmp_path_factory.mktemp("behaviour-cache")


class Controls:
    """Each trainer's final digest after an uninterrupted run, made the first time a test
    asks for it (a test worker makes only the ones its tests need)."""

    def __init__(self, root: Path, cache: Path, processes: int) -> None:
        self._root, self._cache, self._processes = root, cache, processes
        self._digests: dict[str, str] = {}

    def __getitem__(self, trainer: str) -> str:
        if trainer not in self._digests:
            run_dir = self._root / trainer / "run"
            run_dir.parent.mkdir(parents=True, exist_ok=True)  # where multi.launch logs
            if self._processes == 1:
                run(command(trainer, run_dir, self._cache, save_every=STEPS), self._cache)
                self._digests[trainer] = digest(run_dir)
            else:
                _run_k2(trainer, run_dir, self._cache, STEPS)
                self._digests[trainer] = multi.final_digest(run_dir, 2)
        return self._digests[trainer]


@pytest.fixture(scope="session")
def controls(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Controls:
    """Uninterrupted runs of :data:`STEPS` steps, one process."""
    return Controls(tmp_path_factory.mktemp("controls"), cache, 1)


@pytest.fixture(scope="session")
def controls_k2(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Controls:
    """Uninterrupted runs of :data:`STEPS` steps, two processes."""
    return Controls(tmp_path_factory.mktemp("controls-k2"), cache, 2)


@pytest.mark.slow
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("trainer", TRAINERS)
def test_saves_on_the_interval_and_a_rerun_resumes_to_the_same_state(
    tmp_path: Path, trainer: str, sync: bool, cache: Path, controls: Controls
) -> None:
    run_dir = tmp_path / "run"
    run(command(trainer, run_dir, cache, sync=sync), cache)
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [2, 4, 6, 8]
    assert all(e["blocked_s"] >= 0 and e["state_digest"] for e in events(run_dir, "checkpoint"))
    assert kept(run_dir) == [4, 6, 8]  # keep_last 3
    assert digest(run_dir) == controls[trainer]
    # Run again: nothing left to train; the final state comes from the checkpoint.
    steps_before = len(events(run_dir, "step"))
    run(command(trainer, run_dir, cache, sync=sync), cache)
    assert len(events(run_dir, "step")) == steps_before
    assert events(run_dir, "restored")[-1]["step"] == STEPS
    assert digest(run_dir) == controls[trainer]


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_retention_keeps_the_newest_and_reports_what_it_deleted(
    tmp_path: Path, trainer: str, cache: Path, controls: Controls
) -> None:
    run_dir = tmp_path / "run"
    run(command(trainer, run_dir, cache, save_every=1, keep_last=2), cache)
    assert kept(run_dir) == [STEPS - 1, STEPS]
    deleted = sorted(s for e in events(run_dir, "checkpoint") for s in e["deleted_steps"])
    assert deleted == list(range(1, STEPS - 1))
    assert digest(run_dir) == controls[trainer]


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(
    tmp_path: Path, trainer: str, cache: Path, controls: Controls
) -> None:
    run_dir = tmp_path / "run"
    run(command(trainer, run_dir, cache, steps=6), cache)
    flip_a_byte(run_dir / "checkpoints", 6)
    done = run(command(trainer, run_dir, cache), cache)
    [fallback] = events(run_dir, "fallback")
    assert fallback["step"] == 6
    assert "digest" in fallback["reason"] or "mismatch" in fallback["reason"], fallback
    assert str(fallback["moved_to"]).startswith(".damaged-")
    assert events(run_dir, "restored")[-1]["step"] == 4
    assert "checkpoint step 6 failed verification" in done.stderr
    assert digest(run_dir) == controls[trainer]  # steps 5-8 redone, bit for bit


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_preemption_saves_exits_75_and_the_next_run_continues(
    tmp_path: Path, trainer: str, cache: Path, controls: Controls
) -> None:
    run_dir = tmp_path / "run"
    argv = command(trainer, run_dir, cache, save_every=100, step_sleep=0.5)
    proc = subprocess.Popen(
        argv, env=env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: len(events(run_dir, "step")) >= 2, timeout=240, what="two steps")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    [preempted] = events(run_dir, "preempted")
    stopped = preempted["checkpoint_step"]
    assert 2 <= stopped < STEPS
    assert preempted["signal"] == "SIGTERM"
    assert kept(run_dir) == [stopped]  # durable before the exit
    run(command(trainer, run_dir, cache, save_every=100), cache)
    assert events(run_dir, "restored")[-1]["step"] == stopped
    assert digest(run_dir) == controls[trainer]


def _run_k2(trainer: str, run_dir: Path, cache: Path, steps: int) -> multi.Job:
    argv = command(trainer, run_dir, cache, steps=steps)
    job = multi.launch(run_dir, 2, steps, 2, env=env(cache), command=argv)
    codes = job.wait()
    assert codes == [0, 0], f"exit statuses {codes}\n{job.errors()}"
    return job


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_two_processes_agree_on_the_newest_step_both_verify(
    tmp_path: Path, trainer: str, cache: Path, controls_k2: Controls
) -> None:
    run_dir = tmp_path / "run"
    _run_k2(trainer, run_dir, cache, 6)
    assert kept(run_dir) == [2, 4, 6]  # one checkpoint per step for the whole job
    flip_a_byte(run_dir / "checkpoints", 6)
    _run_k2(trainer, run_dir, cache, STEPS)
    fallbacks = multi.of(run_dir, "fallback")
    restored = multi.of(run_dir, "restored")
    for rank in (0, 1):
        assert [e["step"] for e in fallbacks[rank]] == [6], fallbacks
        assert restored[rank][-1]["step"] == 4
        assert restored[rank][-1]["saved_processes"] == 2
    # only process 0 sets the damaged step aside
    assert str(fallbacks[0][0]["moved_to"]).startswith(".damaged-")
    assert fallbacks[1][0]["moved_to"] is None
    assert multi.final_digest(run_dir, 2) == controls_k2[trainer]
