"""Two coordinator replicas (``recover coordinator serve --lease journal``, real processes
sharing one state dir and one journal: its SQLite file, or a PostgreSQL database) against the
session's real Slurm cluster: one leads, the standby commits what is posted to it, and when
the leader is SIGKILLed mid-incident (just before each Slurm update in turn) the standby takes
the lease and finishes the incident with every Slurm action done once."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from recovery import proc, statedir
from recovery.model import HealthEvent, Source
from service.httpapi.client import Client, admin_token
from service.httpapi.server import free_port
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.helpers import RECOVER_SCRIPT
from tests.slurm.helpers import running, submit_loop, wait_for

#: The logging scontrol, which also kills its caller (the leader) just before the update the
#: test names in the file ``{kill}``, once: the call is never made.
KILLING_SHIM = """#!/bin/sh
if [ "$1" = update ] && [ -s "{kill}" ] && echo "$*" | grep -q -- "$(cat "{kill}")"; then
    : > "{kill}"
    kill -9 $PPID
    exit 137
fi
echo "$*" >> "{log}"
exec "{real}" "$@"
"""
DOWN = "update NodeName={node} State=DOWN Reason=recover: xid79 GPU has fallen off the bus"


@dataclass
class Replica:
    name: str
    url: str
    pid: int
    log: Path

    def health(self) -> dict[str, Any]:
        try:
            r = httpx.get(f"{self.url}/healthz", timeout=2.0)
        except httpx.HTTPError:
            return {}
        return dict(r.json()) if r.status_code == 200 else {}

    def leads(self) -> bool:
        return self.health().get("role") == "leader"

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5.0).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        raise AssertionError(f"{name} not exported by {self.name}")


@dataclass
class Pair:
    state_dir: Path
    conf: Path
    env: dict[str, str]
    scontrol_log: Path
    kill_file: Path
    journal_dsn: str | None
    replicas: list[Replica]

    def start(self, name: str) -> Replica:
        port = free_port("127.0.0.1")
        argv = [
            sys.executable, "-m", "recover", "coordinator", "serve",
            "--state-dir", str(self.state_dir), "--listen", f"127.0.0.1:{port}",
            "--slurm-conf", str(self.conf), "--lease", "journal", "--replica-id", name,
        ]  # fmt: skip
        if self.journal_dsn:
            argv += ["--journal-dsn", self.journal_dsn]
        log = self.state_dir.parent / f"{name}.log"
        pid = proc.spawn(argv, self.env, log)
        r = Replica(name, f"http://127.0.0.1:{port}", pid, log)
        self.replicas.append(r)
        wait_for(lambda: r.health() or not proc.alive(pid), 60, f"replica {name} answering")
        assert proc.alive(pid), proc.log_tail(log)
        return r

    @property
    def urls(self) -> str:
        return ",".join(r.url for r in self.replicas)

    def client(self) -> Client:
        """A client of every replica (it finds the leader)."""
        return Client(self.urls, admin_token(self.state_dir / statedir.TOKENS_FILE))

    def updates(self) -> list[str]:
        if not self.scontrol_log.exists():
            return []
        return [ln for ln in self.scontrol_log.read_text().splitlines() if ln.startswith("update")]


@pytest.fixture(params=["sqlite", "postgres"])
def pair(
    request: pytest.FixtureRequest, local_cluster: LocalCluster, slurm_ctl: object, tmp_path: Path
) -> Iterator[Pair]:
    """Replicas started by the test on one state dir, sharing the journal (and the lease in
    it) in the state dir's SQLite file, or in a fresh PostgreSQL database; every replica
    stopped by pid afterwards."""
    dsn = str(request.getfixturevalue("pg_dsn")) if request.param == "postgres" else None
    real = shutil.which("scontrol")
    assert real is not None
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "scontrol.log"
    kill = tmp_path / "kill-before"
    (shim_dir / "scontrol").write_text(KILLING_SHIM.format(log=log, real=real, kill=kill))
    (shim_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}"}
    state = tmp_path / "coordinator"
    state.mkdir()
    p = Pair(state, local_cluster.conf_path, env, log, kill, dsn, [])
    try:
        yield p
    finally:
        for r in p.replicas:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.pid, signal.SIGTERM)
        for r in p.replicas:
            with contextlib.suppress(AssertionError):
                wait_for(_gone(r.pid), 15, f"{r.name} stopped")
            if proc.alive(r.pid):
                os.kill(r.pid, signal.SIGKILL)
                wait_for(_gone(r.pid), 10, f"{r.name} killed")


def _gone(pid: int) -> Callable[[], bool]:
    return lambda: not proc.alive(pid)


def _xid79(node: str) -> dict[str, Any]:
    return HealthEvent(
        id=f"replicas-{node}-{os.getpid()}",
        node=node,
        source=Source.injected,
        fault="xid79",
        observed_at=time.time(),
        injected=True,
    ).model_dump(mode="json")


@pytest.mark.slow
@pytest.mark.parametrize("kill_before", ["State=DOWN", "State=RESUME"])
def test_the_standby_takes_over_a_killed_leader_and_finishes_the_incident_once(
    pair: Pair, slurm_ctl: CliSlurm, job_dir: Path, kill_before: str
) -> None:
    """The leader is SIGKILLed just before each of the incident's Slurm updates in turn."""
    pair.kill_file.write_text(kill_before)
    a = pair.start("replica-a")
    wait_for(a.leads, 30, "replica-a leading")
    b = pair.start("replica-b")
    assert b.health() == {"status": "ok", "role": "standby", "replica": "replica-b",
                          "leader": "replica-a", "term": 1}  # fmt: skip
    assert httpx.get(f"{b.url}/readyz").status_code == 503
    assert httpx.get(f"{a.url}/readyz").status_code == 200
    assert (a.metric("recover_leader"), b.metric("recover_leader")) == (1.0, 0.0)
    # What only the leader knows, only the leader exports (a standby's "0 spares" would fire
    # RecoverSparesExhausted).
    assert a.metric("recover_spares_ready") == 1.0
    with pytest.raises(AssertionError, match="not exported"):
        b.metric("recover_spares_ready")
    # The leader wrote the endpoint file, so local `recover` commands find it.
    assert statedir.read_endpoint(pair.state_dir).url == a.url  # type: ignore[union-attr]
    # A standby refuses what only the leader holds, naming it.
    token = admin_token(pair.state_dir / statedir.TOKENS_FILE)
    refused = httpx.get(f"{b.url}/v1/status", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 503
    assert "replica-b stands by (replica-a leads)" in refused.text
    # A client given the standby first goes on to the leader.
    both = Client(f"{b.url},{a.url}", token)
    assert both.get("/v1/status")["nodes"]

    job_id = submit_loop(slurm_ctl, job_dir)
    (node,) = wait_for(lambda: running(slurm_ctl, job_id), 30, "the job running").nodes
    # Posted to the standby: committed to the shared journal, decided by the leader.
    event = _xid79(node)
    posted = httpx.post(
        f"{b.url}/v1/events",
        json={"events": [event]},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert posted.status_code < 300, posted.text
    assert posted.json()["accepted"] == [event["id"]]
    wait_for(lambda: not proc.alive(a.pid), 30, f"replica-a killed before {kill_before}")
    assert pair.kill_file.read_text() == ""
    wait_for(b.leads, 30, "replica-b taking the lease")
    assert b.health()["term"] == 2
    client = pair.client()

    def closed() -> bool:
        found = [i for i in client.get("/v1/incidents") if i["node"] == node]
        return bool(found) and found[-1]["status"] == "closed"

    wait_for(closed, 90, "the incident closed by the new leader")
    assert pair.updates() == [DOWN.format(node=node), "update NodeName=spare1 State=RESUME"]
    assert slurm_ctl.job(job_id).restart_count == 1
    assert "took the lease (replica-a did not renew" in b.log.read_text()
    # Where the journal is: the state dir's file, or PostgreSQL (and then no file at all).
    assert (pair.state_dir / statedir.JOURNAL_FILE).exists() == (pair.journal_dsn is None)
    # The operator's commands go round the list to the leader (replica-a's address is dead).
    shown = subprocess.run(
        [RECOVER_SCRIPT, "status", "--coordinator", pair.urls,
         "--token-file", str(pair.state_dir / statedir.TOKENS_FILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert node in shown.stdout
