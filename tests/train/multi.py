"""Helpers for multi-process training tests: start K real ``recover train`` processes with
the variables a launcher sets (``RECOVER_NUM_PROCESSES``, ``RECOVER_PROCESS_ID``,
``RECOVER_RENDEZVOUS``), as srun would with Slurm's, and read what each one logged."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from recovery.events import read_rank_events
from recovery.multiproc import free_port
from tests.train.conftest import train_cmd

#: Seconds a process may take to end once it should: far below the ~100 s a process blocked
#: in a collective waits for JAX's heartbeat to give up, so a hang cannot pass as an exit.
STOP_WITHIN_S = 60.0


@dataclass
class Job:
    """K processes of one launch."""

    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def signal(self, rank: int, sig: signal.Signals) -> float:
        """Send ``sig`` to process ``rank``; the wall clock when it was sent."""
        at = time.time()
        self.procs[rank].send_signal(sig)
        return at

    def wait(self, timeout: float = 300.0) -> list[int]:
        """Every process's exit status; fails the test (killing them) if one is still running
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            running = [r for r, p in enumerate(self.procs) if p.poll() is None]
            self.kill()
            pytest.fail(f"processes {running} still running after {timeout:g} s\n{self.errors()}")
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def errors(self) -> str:
        return "\n".join(
            f"--- process {r}:\n{log.read_text()[-3000:]}" for r, log in enumerate(self.logs)
        )


def launch(
    run_dir: Path,
    k: int,
    steps: int,
    save_every: int,
    *extra: str,
    env: dict[str, str] | None = None,
    rank_env: list[dict[str, str]] | None = None,
    command: list[str] | None = None,
) -> Job:
    """Start K processes of ``recover train`` (or of ``command``) on this machine, process
    0's rendezvous on a free loopback port; each one's stderr goes to
    ``<run_dir>.rank<r>.log``. ``rank_env[r]`` adds to process r's environment (its node
    name, say)."""
    port = free_port()
    procs, logs = [], []
    for r in range(k):
        log = run_dir.parent / f"{run_dir.name}.rank{r}.log"
        logs.append(log)
        penv = {
            **os.environ,
            **(env or {}),
            **(rank_env[r] if rank_env else {}),
            "RECOVER_NUM_PROCESSES": str(k),
            "RECOVER_PROCESS_ID": str(r),
            "RECOVER_RENDEZVOUS": f"127.0.0.1:{port}",
        }
        with open(log, "ab") as err:
            procs.append(
                subprocess.Popen(
                    command or train_cmd(run_dir, steps, save_every, *extra),
                    env=penv,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    return Job(procs, logs)


def run(
    run_dir: Path,
    k: int,
    steps: int,
    save_every: int,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Job:
    """:func:`launch` and wait; fails unless every process completed (exit 0)."""
    job = launch(run_dir, k, steps, save_every, *extra, env=env)
    codes = job.wait()
    assert codes == [0] * k, f"exit statuses {codes}\n{job.errors()}"
    return job


def rank_events(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    return read_rank_events(run_dir) if run_dir.exists() else {}


def of(run_dir: Path, event: str) -> dict[int, list[dict[str, Any]]]:
    """Each process's events named ``event``."""
    return {r: [e for e in ev if e["event"] == event] for r, ev in rank_events(run_dir).items()}


def final_digest(run_dir: Path, k: int) -> str:
    """The state digest every one of the K processes completed with (the same for all)."""
    done = of(run_dir, "completed")
    digests = {r: done.get(r, [{}])[-1].get("state_digest") for r in range(k)}
    assert len(set(digests.values())) == 1, f"processes disagree: {digests}"
    assert digests[0] is not None, f"no completed event in {run_dir}"
    return str(digests[0])
