"""RunLock: one writer per checkpoint root, and no stale lock after a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.checkpoint import RunLock
from recovery.errors import CheckpointError, RunLockedError

HOLDER = """
import sys
from recovery.checkpoint import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()  # hold until the parent closes stdin or kills us
"""


@pytest.fixture
def holder(root: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the lock on ``root``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line != "locked\n":
        proc.kill()
        pytest.fail(f"holder did not take the lock: {line!r} {proc.communicate()[1]}")
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def test_second_process_is_refused_with_the_holders_pid(
    root: Path, holder: subprocess.Popen[str]
) -> None:
    lock = RunLock(root)
    with pytest.raises(RunLockedError) as info:
        lock.acquire()
    assert f"pid {holder.pid}" in str(info.value)
    assert str(root) in str(info.value)
    assert isinstance(info.value, CheckpointError)


def test_lock_is_freed_when_the_holder_is_sigkilled(
    root: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(RunLockedError):
        RunLock(root).acquire()

    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert holder.returncode == -signal.SIGKILL

    with RunLock(root).held():
        assert (root / ".lock").read_text() == str(os.getpid())


def test_lock_is_freed_when_the_holder_exits(root: Path, holder: subprocess.Popen[str]) -> None:
    holder.communicate(input="")  # EOF on stdin: the holder returns normally
    assert holder.returncode == 0
    with RunLock(root).held():
        pass


def test_second_lock_in_the_same_process_is_refused_too(root: Path) -> None:
    with RunLock(root).held(), pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
        RunLock(root).acquire()
    # Released on leaving the block, even though acquire() failed inside it.
    with RunLock(root).held():
        pass


def test_held_releases_on_error(root: Path) -> None:
    with pytest.raises(ZeroDivisionError), RunLock(root).held():
        1 / 0  # noqa: B018
    lock = RunLock(root)
    lock.acquire()
    lock.release()
    lock.release()  # idempotent


def test_acquire_creates_the_root(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    with RunLock(root).held():
        assert (root / ".lock").is_file()


def test_a_waiting_acquire_takes_the_lock_once_the_holder_is_gone(
    root: Path, holder: subprocess.Popen[str]
) -> None:
    """An earlier run's process on a node that hung holds the lock until the node is
    power-cycled: the new run waits, then takes it."""
    told: list[str] = []

    def power_cycle(pid: str) -> None:
        told.append(pid)
        holder.kill()
        holder.wait()

    lock = RunLock(root)
    lock.acquire(60, on_wait=power_cycle)
    try:
        assert told == [str(holder.pid)]
        assert (root / ".lock").read_text() == str(os.getpid())
    finally:
        lock.release()


def test_a_waiting_acquire_gives_up_after_its_wait(
    root: Path, holder: subprocess.Popen[str]
) -> None:
    now = [0.0]
    told: list[str] = []

    def sleep(s: float) -> None:
        now[0] += max(s, 0.2)

    with pytest.raises(RunLockedError, match=rf"pid {holder.pid}\) after waiting 5 s"):
        RunLock(root).acquire(5, on_wait=told.append, clock=lambda: now[0], sleep=sleep)
    assert told == [str(holder.pid)]  # said once, not at every retry
    assert now[0] >= 5
