"""SIGKILL of any one process of a K-process run, at random moments (mid-save included), over
and over: the other processes stop by themselves, no restore ever meets a damaged or mixed
step, and the final state equals the uninterrupted K-process run's, bit for bit."""

from __future__ import annotations

import functools
import random
import signal
import time
from pathlib import Path

import pytest

from recovery.multiproc import EXIT_PEER_LOST
from tests.train.conftest import K2_STEPS, wait_for
from tests.train.multi import STOP_WITHIN_S, Job, final_digest, launch, of, rank_events, run


def _logged_or_ended(run_dir: Path, rank: int, after: int, event: str, job: Job) -> bool:
    """Whether process ``rank`` logged ``event`` after its first ``after`` events, or any
    process of ``job`` ended."""
    mine = rank_events(run_dir).get(rank, [])[after:]
    return any(e["event"] == event for e in mine) or any(p.poll() is not None for p in job.procs)


def _crash_loop(
    tmp_path: Path,
    cache: Path,
    *,
    k: int,
    kills: int,
    steps: int,
    model: str,
    seed: int,
    control: str | None = None,
) -> None:
    """Kill one random process of a run that saves every step, ``kills`` times, resuming
    each time; then finish and compare with the uninterrupted K-process control.

    As in the single-process loop (``test_processes``), no killed run may reach the end: each
    trains to ``steps - 1`` (the total does not enter the computation) and only the last run
    finishes; one that got there before its kill simply ends, as do the runs after it.
    """
    extra = ("--model", model, "--compile-cache", str(cache))
    if control is None:
        run(tmp_path / "control", k, steps, steps, *extra)
        control = final_digest(tmp_path / "control", k)
    run_dir = tmp_path / "run"
    rng = random.Random(seed)
    killed = 0
    for i in range(kills):
        victim = rng.randrange(k)
        # After a step its save is usually being written; after a checkpoint the run made
        # progress; warmup is the start of training (restores just done).
        target = rng.choice(["step", "step", "checkpoint", "warmup"])
        before = len(rank_events(run_dir).get(victim, []))
        job = launch(run_dir, k, steps - 1, 1, "--auto-resume", "--step-sleep", "0.02", *extra)
        try:
            wait_for(
                functools.partial(_logged_or_ended, run_dir, victim, before, target, job),
                timeout=300,
                what=f"a {target} event of process {victim} in run {i}",
            )
            time.sleep(rng.uniform(0.0, 0.05))
            landed = all(p.poll() is None for p in job.procs)
            if landed:
                job.signal(victim, signal.SIGKILL)
                killed += 1
            codes = job.wait(STOP_WITHIN_S)
        finally:
            job.kill()
        if landed:
            assert codes[victim] in (-signal.SIGKILL, 0), job.errors()
            # 0: the run was already complete when the kill landed (its last exit). Process 0
            # hosts JAX's coordination service: at its death JAX's own error poll may abort a
            # survivor (SIGABRT) before the group's news reaches it. And a peer killed while
            # it sent a collective's data can leave a survivor's gloo pair reading a short
            # message, which gloo's own thread turns into std::terminate (SIGABRT, with
            # "gloo::EnforceNotMet" on stderr). Both are in docs/multiprocess.md.
            for r, code in enumerate(codes):
                if r == victim or code in (EXIT_PEER_LOST, 0):
                    continue
                assert code == -signal.SIGABRT, f"run {i}: {codes}\n{job.errors()}"
                assert victim == 0 or "gloo::EnforceNotMet" in job.logs[r].read_text(), (
                    f"run {i}: process {r} aborted without gloo's enforce failure: {codes}\n"
                    f"{job.errors()}"
                )
        else:
            assert codes == [0] * k, f"run {i} ended before its kill: {codes}\n{job.errors()}"
    assert killed, "no kill landed while a run was training"
    run(run_dir, k, steps, 1, "--auto-resume", *extra)
    falls = of(run_dir, "fallback")
    assert not any(falls.values()), f"a save was not atomic: {falls}"
    lost = [e for evs in of(run_dir, "peer-lost").values() for e in evs]
    assert lost, "no process recorded a lost peer"
    assert final_digest(run_dir, k) == control


@pytest.mark.slow
def test_sigkill_of_any_process_two_processes(
    tmp_path: Path, cache: Path, k2_control: tuple[int, str]
) -> None:
    steps, control = k2_control
    assert steps == K2_STEPS
    _crash_loop(
        tmp_path, cache, k=2, kills=2, steps=steps, model="mlp-tiny", seed=1, control=control
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("k", "kills"),
    [
        (4, 3),
        pytest.param(2, 8, marks=pytest.mark.soak),
        pytest.param(3, 8, marks=pytest.mark.soak),
        pytest.param(4, 8, marks=pytest.mark.soak),
    ],
)
def test_sigkill_loop_many_kills(tmp_path: Path, cache: Path, k: int, kills: int) -> None:
    _crash_loop(tmp_path, cache, k=k, kills=kills, steps=kills * 5 + 6, model="mlp-tiny-48", seed=k)
