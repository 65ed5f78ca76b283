"""Where a process on this node is stuck, read from outside it: every thread's Python stack
(py-spy, which reads the process's memory: it works on a process that is stopped whole or
whose main thread holds the GIL in native code), else what the kernel says of each thread
(state, the system call it waits in). Bounded in time; a process that cannot be read is
noted as such, never waited on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

#: Seconds a stack dump may take.
TIMEOUT_S = 10.0


def py_spy() -> str | None:
    """The py-spy program: beside this Python (the agent's venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def state(pid: int) -> str:
    """The process's state letter (``R``, ``S``, ``D``, ``T`` stopped, ...); ``?`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[-1].split()[0]


def capture(pid: int, timeout_s: float = TIMEOUT_S) -> str:
    """Every thread's stack of process ``pid``, as text (never raises)."""
    spy = py_spy()
    if spy is not None:
        # A stopped process cannot be paused for a consistent read: read it as it lies.
        modes = [["--nonblocking"], []] if state(pid) == "T" else [[], ["--nonblocking"]]
        errors = []
        for extra in modes:
            try:
                done = subprocess.run(
                    [spy, "dump", "--pid", str(pid), *extra],
                    capture_output=True, text=True, timeout=timeout_s,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                errors.append(f"py-spy gave no answer within {timeout_s:g} s")
                continue
            except OSError as e:
                errors.append(f"py-spy could not run: {e}")
                break
            if done.returncode == 0 and "Thread" in done.stdout:
                return done.stdout.strip()
            errors.append(f"py-spy: {(done.stderr or done.stdout).strip()[-300:]}")
        return "\n".join([*errors, kernel_view(pid)])
    return "py-spy is not installed (pip install py-spy); the kernel's view:\n" + kernel_view(pid)


def kernel_view(pid: int) -> str:
    """Each thread's name, state and the system call it waits in, from /proc."""
    lines = []
    try:
        tids = sorted(int(p.name) for p in Path(f"/proc/{pid}/task").iterdir())
    except OSError as e:
        return f"process {pid} cannot be read: {e}"
    for tid in tids:
        base = Path(f"/proc/{pid}/task/{tid}")
        try:
            name = (base / "comm").read_text().strip()
            stat = (base / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            syscall = (base / "syscall").read_text().split()[0]
        except OSError:
            continue
        where = "running" if syscall == "running" else f"in system call {syscall}"
        lines.append(f"thread {tid} ({name}): state {stat}, {where}")
    return "\n".join(lines) or f"process {pid} has no threads left"
