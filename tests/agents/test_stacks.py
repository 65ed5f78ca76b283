"""Reading a stuck process's stacks from outside it: with py-spy, whether its main thread is
blocked in a system call or the whole process is stopped; without it, the kernel's view."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from agents import stacks

STUCK = """
import os, threading, time
def beat():
    while True:
        time.sleep(0.2)
threading.Thread(target=beat, name="beat", daemon=True).start()
def wait_for_data():
    r, _ = os.pipe()
    print("ready", flush=True)
    os.read(r, 1)
wait_for_data()
"""


@pytest.fixture
def stuck() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)  # into the read
    yield proc
    proc.kill()
    os.kill(proc.pid, signal.SIGCONT)
    proc.wait(10)
    proc.stdout.close()


@pytest.mark.parametrize("stopped", [False, True])
def test_py_spy_reads_every_thread(stuck: subprocess.Popen[str], stopped: bool) -> None:
    if stacks.py_spy() is None:
        pytest.skip("py-spy is not installed (the agent extra brings it: pip install py-spy)")
    if stopped:
        os.kill(stuck.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while stacks.state(stuck.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
    text = stacks.capture(stuck.pid)
    assert '"MainThread"' in text
    assert "wait_for_data (<string>:10)" in text
    assert '"beat"' in text


def test_without_py_spy_the_kernel_says_where_each_thread_waits(
    stuck: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    text = stacks.capture(stuck.pid)
    assert "py-spy is not installed" in text
    main = next(line for line in text.splitlines() if line.startswith(f"thread {stuck.pid} "))
    assert "state S, in system call 0" in main  # read(2) on x86-64


def test_a_process_that_is_gone_is_said_to_be() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert stacks.state(proc.pid) == "?"
    assert "cannot be read" in stacks.kernel_view(proc.pid)
