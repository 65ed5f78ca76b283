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

from recovery import proc, statedir
from service.daemons import agents as agents_proc
from service.daemons import coordinator as coordinator_proc
from slurm.cluster import LocalCluster
from tests.coordinator.helpers import SHIM, Coordinator


@pytest.fixture
def policy_file() -> Path | None:
    """The policy file the test's coordinator serves with (None: the defaults); a test
    module overrides this fixture to serve with its own."""
    return None


@pytest.fixture
def journal_dsn(request: pytest.FixtureRequest) -> str | None:
    """Where the test's coordinator keeps its journal: None, the state dir's SQLite file (the
    default); a test parametrizes it (indirectly) with ``postgres`` for a fresh database on
    the session's PostgreSQL server."""
    if getattr(request, "param", "sqlite") == "postgres":
        return str(request.getfixturevalue("pg_dsn"))
    return None


@pytest.fixture
def coordinator(
    local_cluster: LocalCluster,
    slurm_ctl: object,
    tmp_path: Path,
    policy_file: Path | None,
    journal_dsn: str | None,
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
    c = Coordinator(
        tmp_path / "coordinator", local_cluster.conf_path, env, log, config=policy_file,
        journal_dsn=journal_dsn,
    )  # fmt: skip
    c.start()
    try:
        yield c
        if journal_dsn is not None:  # the journal went to PostgreSQL, not to a file
            assert not (c.state_dir / statedir.JOURNAL_FILE).exists()
    finally:
        coordinator_proc.stop(c.state_dir)
        if c.endpoint is not None:
            assert not proc.alive(c.endpoint.pid), "coordinator left running"


NODES = ["node1", "node2", "node3", "spare1"]


@pytest.fixture
def agents(coordinator: Coordinator) -> Iterator[dict[str, int]]:
    """An agent per node, connected to the coordinator; stopped by pid afterwards."""
    client = coordinator.client

    def connected() -> set[str]:
        return {a["node"] for a in client.get("/v1/agents") if a["connected"]}

    assert coordinator.endpoint is not None
    pids = agents_proc.start_agents(
        coordinator.state_dir, NODES, coordinator.endpoint.url, connected=connected
    )
    try:
        yield pids
    finally:
        agents_proc.stop_agents(coordinator.state_dir)
        assert agents_proc.running(coordinator.state_dir) == {}
