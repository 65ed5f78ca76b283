"""`cluster down` finds a job's processes by the job's own environment: a step's task whose
slurmstepd is gone is nobody's descendant, and it must not outlive the cluster. A shell that
only exported the cluster's SLURM_CONF (`eval "$(recover cluster env)"`) is not a job's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm import procs


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> int:
        p = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            env={"PATH": os.environ.get("PATH", ""), **env},
        )
        started.append(p)
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait()


def test_a_jobs_process_is_found_by_its_environment(spawn: object, tmp_path: Path) -> None:
    marker = str(tmp_path / "slurm")
    conf = f"{marker}/slurm.conf"
    task = spawn({"SLURM_CONF": conf, "SLURM_JOB_ID": "7"})  # type: ignore[operator]
    shell = spawn({"SLURM_CONF": conf})  # type: ignore[operator]
    other = spawn({"SLURM_CONF": "/elsewhere/slurm.conf", "SLURM_JOB_ID": "7"})  # type: ignore[operator]
    found = procs.cluster_processes(marker)
    assert task in found
    assert shell not in found
    assert other not in found
    # A node's processes are its slurmd's and steps' alone: a job's task is found through them.
    assert task not in procs.cluster_processes(marker, node="node1")
