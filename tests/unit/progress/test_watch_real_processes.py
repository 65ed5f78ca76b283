"""The watcher against real processes that hang the two ways a rank really hangs: its main
thread blocked in a system call while its other threads live, and the whole process stopped
(SIGSTOP). Two processes step in lockstep (process 0 waits for process 1's step, as in a
collective), each with its liveness thread, and the watcher reads their files from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recovery.progress import Budgets, StallWatch, Verdict, read_records

pytestmark = pytest.mark.slow

WORKER = r"""
import os, sys, time
from pathlib import Path
from recovery.progress import ProgressWriter, read_record, record_path

directory, rank, block = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
w = ProgressWriter(directory, rank=rank, size=2, node=f"node{rank + 1}")
w.start_alive(every_s=0.2)
step = 0
while True:
    if rank == 1 and block.exists():
        r, _ = os.pipe()
        os.read(r, 1)  # the main thread blocks in a system call; the liveness thread runs on
    w.step_started(step + 1)
    if rank == 0:  # a collective: wait until process 1 entered the same step
        peer = record_path(directory, 1)
        while not peer.exists() or read_record(peer).step_started < step + 1:
            time.sleep(0.005)
    time.sleep(0.1)
    step += 1
    w.step_finished(step)
"""


def start(tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(tmp_path / "progress"),
                str(r),
                str(tmp_path / "block"),
            ],
            env=env,
        )
        for r in (0, 1)
    ]


def watch_until(watch: StallWatch, directory: Path, state: str, timeout: float) -> Verdict:
    deadline = time.monotonic() + timeout
    while True:
        verdict = watch.observe(read_records(directory), time.time())
        if verdict.state == state or time.monotonic() > deadline:
            return verdict
        time.sleep(0.1)


def steps_reached(directory: Path, steps: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_records(directory)
        if len(records) == 2 and min(r.step_finished for r in records.values()) >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(f"the workers did not reach step {steps}: {read_records(directory)}")


# generous against a loaded machine (a healthy step held off the CPU is no hang)
BUDGETS = Budgets(floor_s=4.0, factor=5, learn_after=3, frozen_after_s=4.0)


@pytest.mark.parametrize("hang", ["syscall", "sigstop"])
def test_a_real_hang_is_noticed_and_the_culprit_named(tmp_path: Path, hang: str) -> None:
    procs = start(tmp_path)
    progress = tmp_path / "progress"
    try:
        watch = StallWatch(BUDGETS)
        steps_reached(progress, 10)
        v = watch_until(watch, progress, "stalled", timeout=1.0)
        assert v.state == "running", v  # healthy: no accusation
        assert watch.step_budget_s() == BUDGETS.floor_s
        if hang == "syscall":
            (tmp_path / "block").touch()
        else:
            os.kill(procs[1].pid, signal.SIGSTOP)
        v = watch_until(watch, progress, "stalled", timeout=30)
        assert v.stalled, v
        assert v.confident, v
        assert [(c.rank, c.node, c.pid) for c in v.culprits] == [(1, "node2", procs[1].pid)]
        expected = "did not enter step" if hang == "syscall" else "frozen"
        assert expected in v.culprits[0].why, v
        # the blocked process's other thread still runs: it is not taken for frozen
        alive = read_records(progress)[1].alive_at
        if hang == "syscall":
            assert time.time() - alive < BUDGETS.frozen_after_s
    finally:
        for p in procs:
            with_suppressed_kill(p)


def with_suppressed_kill(p: subprocess.Popen[bytes]) -> None:
    try:
        p.kill()
        os.kill(p.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    p.wait(10)
