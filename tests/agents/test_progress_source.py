"""The agent's ``progress`` source against real training-like processes on two simulated
nodes (one registry, as on the local cluster where the nodes share a machine): a process
whose main thread blocks in a system call, and one stopped whole, are reported once, by the
agent of their own node, as ``rank-hang`` and ``rank-frozen``, with their stacks kept; a
healthy job, a job that ended, and a dead process are not reported at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents.progress import ProgressSource
from recovery.model import HealthEvent, Source
from recovery.ports.clock import SystemClock
from recovery.progress import Budgets, read_records
from recovery.progress.registry import entries

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import os, sys, time
from pathlib import Path
from recovery.progress import ProgressWriter, read_record, record_path

directory, block, registry = Path(sys.argv[1]), Path(sys.argv[3]), Path(sys.argv[4])
rank, steps = int(sys.argv[2]), int(sys.argv[5])
w = ProgressWriter(
    directory, rank=rank, size=2, node=f"node{rank + 1}", registry=registry, job="77"
)
w.start_alive(every_s=0.2)
step = 0
def wait_for_data():
    r, _ = os.pipe()
    os.read(r, 1)
while step < steps:
    if rank == 1 and block.exists():
        wait_for_data()  # the main thread blocks in a system call; the liveness thread runs on
    w.step_started(step + 1)
    if rank == 0:  # a collective: wait until process 1 entered the same step
        peer = record_path(directory, 1)
        while not peer.exists() or read_record(peer).step_started < step + 1:
            time.sleep(0.005)
    time.sleep(0.1)
    step += 1
    w.step_finished(step)
w.close()
"""

# Generous against a loaded machine: a healthy step held off the CPU is no hang.
BUDGETS = Budgets(floor_s=4.0, factor=5, learn_after=3, frozen_after_s=4.0)


class Rig:
    def __init__(self, tmp_path: Path, steps: int = 10_000) -> None:
        self.tmp = tmp_path
        self.progress = tmp_path / "run" / "progress"
        self.registry = tmp_path / "registry"
        self.block = tmp_path / "block"
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [str(self.block), str(self.registry), str(steps)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(self.progress), str(r), *args], env=env
            )
            for r in (0, 1)
        ]
        self.stacks: list[int] = []

        def fake_stacks(pid: int) -> str:
            self.stacks.append(pid)
            return f'Thread {pid} (idle): "MainThread"\n    wait_for_data (worker.py:11)\n'

        self.sources = {
            node: ProgressSource(node, SystemClock(), self.registry, budgets=BUDGETS,
                                 stacks=fake_stacks, log=lambda _: None)
            for node in ("node1", "node2")
        }  # fmt: skip

    def tick(self) -> list[HealthEvent]:
        """One look by each agent, at the same time, as separate agents look: the one that
        reports waits (up to STACKS_WAIT_S) for the other's stacks, which the other takes in
        its own look meanwhile. (Looking one after the other, a report found first by the
        second agent waited for stacks the first could only take after it.)"""
        with ThreadPoolExecutor(len(self.sources)) as pool:
            found = list(pool.map(lambda s: s.tick(), self.sources.values()))
        return [e for events in found for e in events]

    def until(self, what: str, done, timeout: float = 30.0) -> list[HealthEvent]:  # type: ignore[no-untyped-def]
        """Tick both agents every 0.2 s until ``done(events so far)``; the events."""
        seen: list[HealthEvent] = []
        deadline = time.monotonic() + timeout
        while not done(seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s; events {seen}")
            seen += self.tick()
            time.sleep(0.2)
        return seen

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                os.kill(p.pid, signal.SIGCONT)
            p.wait(10)


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = Rig(tmp_path)
    yield r
    r.close()


def healthy(rig: Rig, for_s: float = 3.0) -> None:
    """Both processes registered and stepping; the agents learn the job and say nothing."""
    rig.until("both registered", lambda _: len(entries(rig.registry)) == 2)
    start = time.monotonic()
    events = rig.until("a healthy while", lambda _: time.monotonic() - start > for_s)
    assert events == []


@pytest.mark.parametrize("hang", ["syscall", "sigstop"])
def test_the_culprits_own_agent_reports_it_once(rig: Rig, hang: str) -> None:
    healthy(rig)
    if hang == "syscall":
        rig.block.touch()
    else:
        os.kill(rig.procs[1].pid, signal.SIGSTOP)
    (event,) = rig.until("a report", lambda seen: bool(seen))
    assert (event.node, event.source) == ("node2", Source.progress)
    assert event.fault == ("rank-hang" if hang == "syscall" else "rank-frozen")
    assert f"job 77: rank 1 (pid {rig.procs[1].pid})" in event.message
    assert "wait_for_data (worker.py:11)" in event.message
    assert event.id.startswith("node2-progress-")
    # The stacks of each agent's own processes are kept beside the records.
    assert sorted(rig.stacks) == sorted(p.pid for p in rig.procs)
    kept = (rig.progress / "stacks" / "rank1.txt").read_text()
    assert kept.startswith(f"rank 1 pid {rig.procs[1].pid} on node2")
    # Once per stall: more looks report nothing more.
    start = time.monotonic()
    assert rig.until("quiet", lambda _: time.monotonic() - start > 2) == []


def test_a_job_that_ends_is_not_reported(tmp_path: Path) -> None:
    rig = Rig(tmp_path, steps=30)
    try:
        healthy(rig, for_s=1.0)
        for p in rig.procs:
            assert p.wait(60) == 0
        # Ended cleanly: their entries are gone, and nothing is judged.
        assert entries(rig.registry) == []
        start = time.monotonic()
        assert rig.until("after the end", lambda _: time.monotonic() - start > 6) == []
    finally:
        rig.close()


def test_a_dead_process_is_not_taken_for_a_hung_one(rig: Rig) -> None:
    """Killed (its death is reported otherwise): its record stops as a frozen one's would,
    but its agent finds the process gone, drops its entry and blames nobody; the peer's
    agent does not blame another node's process."""
    healthy(rig, for_s=1.0)
    rig.procs[1].kill()
    rig.procs[1].wait()
    start = time.monotonic()
    assert rig.until("after a death", lambda _: time.monotonic() - start > 7) == []
    assert [e.node for e in entries(rig.registry)] == ["node1"]  # its entry removed


GUARDED = r"""
import os, sys, time
from pathlib import Path
from recovery.progress import ProgressWriter, read_record, record_path

directory, registry, rank = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
long_s = float(sys.argv[4])
w = ProgressWriter(
    directory, rank=rank, size=2, node=f"node{rank + 1}", registry=registry, job="78"
)
w.start_alive(every_s=0.2)
other = record_path(directory, 1 - rank)

def meet(step):  # a collective: both processes entered the step
    w.step_started(step)
    while not other.exists() or read_record(other).step_started < step:
        time.sleep(0.005)

def step(n):
    meet(n)
    time.sleep(0.05)
    w.step_finished(n)

meet(1)
time.sleep(long_s)          # the first step compiles (a loop without a warm-up of its own)
w.step_finished(1)
for n in range(2, 40):
    step(n)
with w.phase("save"):       # a save the loop waits for, far slower than a step
    time.sleep(long_s)
for n in range(40, 60):
    step(n)
if rank == 0:               # only the lead evaluates; the other waits for it in the loop
    with w.phase("evaluation"):
        time.sleep(long_s)
for n in range(60, 80):
    step(n)
with w.phase("paused"):     # idle between phases on purpose
    time.sleep(long_s)
for n in range(80, 100):
    step(n)
if rank == 1:               # then a real hang: the main thread blocks in a system call
    r, _ = os.pipe()
    os.read(r, 1)
meet(100)
"""


def test_long_announced_phases_are_never_taken_for_a_hang(tmp_path: Path) -> None:
    """The false-positive guards on real processes: a first step that compiles, a save, an
    evaluation on one process while the other waits for it, and a pause, each lasting several
    times the job's learned step budget (1 s here): no report. Then process 1 really hangs,
    and the same agents report it: the quiet was not deafness."""
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED)
    registry, progress = tmp_path / "registry", tmp_path / "run" / "progress"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    long_s = 6.0
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(progress), str(registry), str(r), str(long_s)],
            env=env,
        )
        for r in (0, 1)
    ]
    budgets = Budgets(floor_s=1.0, factor=5, learn_after=3, frozen_after_s=4.0)
    sources = [
        ProgressSource(n, SystemClock(), registry, budgets=budgets, stacks=lambda pid: "",
                       log=lambda _: None)
        for n in ("node1", "node2")
    ]  # fmt: skip
    try:
        events: list[HealthEvent] = []
        deadline = time.monotonic() + 180
        while not events:
            assert time.monotonic() < deadline, "no report of the final hang"
            assert [p.poll() for p in procs] == [None, None]
            records = read_records(progress)
            reached = min((r.step_finished for r in records.values()), default=-1)
            events += [e for s in sources for e in s.tick()]
            if events:  # the hang is the first report, once every phase is behind
                assert reached >= 99, [e.message for e in events]
            time.sleep(0.2)
        (event,) = events
        assert (event.node, event.fault) == ("node2", "rank-hang")
        assert "did not enter step 100" in event.message
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
