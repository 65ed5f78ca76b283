"""The real coordinator (``recover coordinator serve`` as its own process, started the way
``recover cluster up --coordinator`` starts it) against the session's real Slurm cluster.

Each test gets a fresh coordinator with an empty journal; every ``scontrol`` it runs is logged
by a shim on its PATH, so tests can count the Slurm updates it made (no duplicates after a
restart).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery import proc
from recovery.service import process
from slurm.cluster import LocalCluster
from tests.coordinator.helpers import SHIM, Coordinator


@pytest.fixture
def coordinator(
    local_cluster: LocalCluster, slurm_ctl: object, tmp_path: Path
) -> Iterator[Coordinator]:
    """A fresh coordinator on the (reset) session cluster; stopped by pid afterwards."""
    real = shutil.which("scontrol")
    assert real is not None
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "scontrol.log"
    shim = shim_dir / "scontrol"
    shim.write_text(SHIM.format(log=log, real=real))
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}"}
    c = Coordinator(tmp_path / "coordinator", local_cluster.conf_path, env, log)
    c.start()
    try:
        yield c
    finally:
        process.stop(c.state_dir)
        if c.endpoint is not None:
            assert not proc.alive(c.endpoint.pid), "coordinator left running"
