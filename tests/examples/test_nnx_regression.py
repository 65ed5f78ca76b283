"""The Flax NNX example recovers as the Flax one does: a SIGTERM makes it save and exit with
75, a SIGKILL loses at most the steps since its newest checkpoint, and the rerun ends with
the uninterrupted run's state digest, bit for bit (the model's ``nnx.Rngs`` keys and counts
included). As two ``jax.distributed`` processes on CPU, a run restored onto the job's devices
either way (``--place template`` or ``local``) ends with an uninterrupted two-process run's
digest."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recovery.api import EXIT_PREEMPTED, read_events
from recovery.multiproc import free_port
from tests.examples.conftest import ROOT, events, wait_for_event

SCRIPT = ROOT / "examples" / "nnx_regression" / "train.py"
#: Steps of every run in these tests, its checkpoint period, and where a first leg stops.
STEPS, SAVE_EVERY, LEG = 20, 5, 12


def command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(SCRIPT), "--run-dir", str(run_dir),
        "--save-every", str(SAVE_EVERY), *extra,
    ]  # fmt: skip


def digest_of(stdout: str, steps: int = STEPS) -> str:
    m = re.search(rf"completed step {steps} state_digest (\w+)", stdout)
    assert m is not None, stdout
    return m.group(1)


def run(run_dir: Path, env: dict[str, str], *extra: str) -> str:
    """Run the example to step ``STEPS``; its final state digest (fails unless it exits 0)."""
    done = subprocess.run(
        command(run_dir, "--steps", str(STEPS), *extra),
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return digest_of(done.stdout)


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory, example_env: dict[str, str]) -> str:
    """The final digest of an uninterrupted single-process run."""
    return run(tmp_path_factory.mktemp("nnx-control") / "run", example_env)


def interrupted(run_dir: Path, env: dict[str, str], sig: int, event: str, step: int) -> int:
    """Start a slowed-down run, send ``sig`` once its log has ``event`` at ``step``; its
    exit status."""
    proc = subprocess.Popen(
        command(run_dir, "--steps", str(STEPS), "--step-delay", "0.1"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_event(run_dir, event, step, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (EXIT_PREEMPTED, -signal.SIGKILL), err[-3000:]
    return proc.returncode


@pytest.mark.slow
def test_sigterm_saves_exits_75_and_the_rerun_matches_the_control(
    tmp_path: Path, example_env: dict[str, str], control: str
) -> None:
    run_dir = tmp_path / "run"
    assert interrupted(run_dir, example_env, signal.SIGTERM, "step", 6) == EXIT_PREEMPTED
    (preempted,) = events(run_dir, "preempted")
    stopped = preempted["step"]
    assert [e["step"] for e in events(run_dir, "checkpoint")][-1] == stopped

    assert run(run_dir, example_env) == control
    (restored,) = events(run_dir, "restored")
    assert restored["step"] == stopped  # saved at the signal: nothing recomputed
    started = [e["event"] for e in events(run_dir) if e["event"] in ("started", "restored")]
    assert started == ["started", "started", "restored"]


@pytest.mark.slow
def test_sigkill_restarts_from_the_newest_checkpoint_and_matches_the_control(
    tmp_path: Path, example_env: dict[str, str], control: str
) -> None:
    run_dir = tmp_path / "run"
    killed = interrupted(run_dir, example_env, signal.SIGKILL, "checkpoint", 2 * SAVE_EVERY)
    assert killed == -signal.SIGKILL
    assert events(run_dir, "preempted") == []

    assert run(run_dir, example_env) == control
    (restored,) = events(run_dir, "restored")
    assert restored["step"] >= 2 * SAVE_EVERY
    assert restored["step"] % SAVE_EVERY == 0  # a periodic checkpoint, not a final save


# --- two processes -----------------------------------------------------------------------


def start_pair(run_dir: Path, env: dict[str, str], *extra: str) -> list[subprocess.Popen[str]]:
    """Both processes of one two-process launch (one CPU device each), as a launcher starts
    them: the ``RECOVER_*`` variables and process 0's address."""
    port = free_port()
    procs = []
    for rank in range(2):
        launch = {
            "RECOVER_NUM_PROCESSES": "2",
            "RECOVER_PROCESS_ID": str(rank),
            "RECOVER_RENDEZVOUS": f"127.0.0.1:{port}",
        }
        proc = subprocess.Popen(
            command(run_dir, *extra),
            env={**env, **launch},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
    return procs


def finish_pair(procs: list[subprocess.Popen[str]], steps: int) -> str:
    """The launch's final digest, once both processes ended with 0 and the same digest."""
    digests = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, f"exit {p.returncode}\n{err[-3000:]}"
            digests.append(digest_of(out, steps))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert digests[0] == digests[1]
    return digests[0]


@pytest.fixture(scope="module")
def pair_runs(
    tmp_path_factory: pytest.TempPathFactory, example_env: dict[str, str]
) -> tuple[str, Path]:
    """An uninterrupted two-process run's final digest, and the run directory of a
    two-process run that stopped at step ``LEG`` (both launched at once)."""
    base = tmp_path_factory.mktemp("nnx-pairs")
    control = start_pair(base / "control", example_env, "--steps", str(STEPS))
    leg = start_pair(base / "leg", example_env, "--steps", str(LEG))
    digest = finish_pair(control, STEPS)
    finish_pair(leg, LEG)
    return digest, base / "leg"


@pytest.mark.slow
@pytest.mark.parametrize("place", ["template", "local"])
def test_two_processes_resume_placed_on_the_job_and_match(
    tmp_path: Path, example_env: dict[str, str], pair_runs: tuple[str, Path], place: str
) -> None:
    control, leg = pair_runs
    run_dir = tmp_path / "run"
    shutil.copytree(leg, run_dir)
    resumed = start_pair(run_dir, example_env, "--steps", str(STEPS), "--place", place)
    assert finish_pair(resumed, STEPS) == control
    for log in ("events.jsonl", "events.rank1.jsonl"):
        restored = [e for e in read_events(run_dir / log) if e["event"] == "restored"]
        assert [e["step"] for e in restored] == [LEG]
    assert os.path.exists(run_dir / "checkpoints" / f"step_{STEPS:08d}")
