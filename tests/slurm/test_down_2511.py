"""``cluster down`` on Slurm 25.11 leaves no job step behind.

25.11's slurmstepd writes its process title over its environment, so the cluster's marker
cannot be read there; ``slurm.procs`` also knows a step by the state-dir files it holds open.
Without that, ``down`` left every 25.11 step and its job processes running (hundreds, over
many test sessions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery.ports.slurm import BatchJob
from slurm import procs
from slurm.cluster import LocalCluster
from tests.plugins.slurm_cluster import require_2511
from tests.slurm.helpers import SLURMD_TIMEOUT_S, require_local_slurm, wait_for

pytestmark = pytest.mark.slurm


def processes_with(marker: str) -> list[int]:
    """Pids whose command line carries ``marker`` (the job's own processes)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmdline = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(p.name))
    return found


def stepds_of(state_dir: Path) -> list[int]:
    """slurmstepd processes holding a file open under ``state_dir``."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "comm").read_text().strip() != "slurmstepd":
                continue
            links = [os.readlink(fd) for fd in (p / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(f"{state_dir}/") for link in links):
            found.append(int(p.name))
    return found


def test_down_stops_every_step_of_a_two_node_job(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_local_slurm()
    built = require_2511()
    # Not tmp_path: its folder is named after this test, too deep for slurmstepd's sockets.
    tmp_path = tmp_path_factory.mktemp("down2511")
    state = tmp_path / "slurm"
    cluster = LocalCluster(state, slurmd_timeout_s=SLURMD_TIMEOUT_S, install=built)
    info = cluster.up(nodes=2, spares=0)
    marker = f"{3000 + os.getpid() % 900}"
    try:
        ctl = cluster.control()
        ctl.submit(
            BatchJob(
                f"#!/bin/bash\nsrun sleep {marker}\n",
                {"nodes": "2", "ntasks-per-node": "1", "output": str(tmp_path / "o-%j")},
                workdir=str(tmp_path),
            )
        )
        # Both nodes run a step (the batch step and one srun task each): sleep on both.
        wait_for(lambda: len(processes_with(f"sleep\0{marker}")) >= 2, 60, "srun's tasks")
        assert stepds_of(state), "no slurmstepd of this cluster seen"
    finally:
        cluster.down()
    assert stepds_of(state) == []
    assert processes_with(f"sleep\0{marker}") == []
    assert not procs.cluster_processes(str(info.state_dir))
