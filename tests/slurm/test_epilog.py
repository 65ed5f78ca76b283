"""Our Epilog (agents/epilog.py), run as slurmd runs it: ``python3 -I`` on the file, with
slurmd's variables and no PATH of ours, against a coordinator stand-in on loopback answering
``GET /v1/incidents`` and a recording ``scontrol``. What it does on a real 25.11 cluster (Slurm
requeueing the job at once) is in tests/slurm/test_expedite.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import agents.epilog

EPILOG = Path(agents.epilog.__file__)
TOKEN = "n1-token-0123456789abcdef"  # noqa: S105 - a test token


class Coordinator:
    """Answers ``GET /v1/incidents?open=true`` with ``incidents`` to the node token only."""

    def __init__(self) -> None:
        self.incidents: list[dict[str, Any]] = []
        self.asked: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps(outer.incidents).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    c = Coordinator()
    d = tmp_path / "coordinator"
    d.mkdir()
    (d / "coordinator.json").write_text(json.dumps({"url": c.url, "pid": 1}))
    (d / "tokens").write_text(f"admin {'a' * 20}\nnode n1 {TOKEN}\n")
    yield c
    c.server.shutdown()
    c.server.server_close()


def run_epilog(
    tmp_path: Path, exit_code: str, *args: str, nodelist: str = "n1", shows: str = "IDLE"
) -> tuple[int, str, list[str]]:
    """Run the Epilog as slurmd would (no PATH of ours: a recording scontrol only); returns
    its status, its log and the scontrol calls."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol.calls"
    # Records every call; `show node` answers with the state in $NODE_SHOWS (default: idle).
    (bindir / "scontrol").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        'if [ "$2" = show ]; then echo "NodeName=n1 State=${NODE_SHOWS:-IDLE} Reason="; fi\n'
    )
    (bindir / "scontrol").chmod(0o755)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_EXIT_CODE": exit_code,
        "SLURM_JOB_NODELIST": nodelist,
        "NODE_SHOWS": shows,
        "SLURM_CONF": "/nonexistent/slurm.conf",
    }
    done = subprocess.run(
        [sys.executable, "-I", str(EPILOG), *args], env=env, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip
    made = calls.read_text().splitlines() if calls.exists() else []
    return done.returncode, done.stderr, made


def incident(node: str, fault: str = "xid79", verdict: str = "replace") -> dict[str, Any]:
    return {"id": "inc-7", "node": node, "fault": fault, "verdict": verdict, "status": "open"}


def test_a_failed_job_on_a_faulted_node_fails_the_epilog_and_drains_it_as_ours(
    tmp_path: Path, coordinator: Coordinator
) -> None:
    coordinator.incidents = [incident("n2"), incident("n1")]
    rc, log, calls = run_epilog(
        tmp_path, "34304", "--coordinator-dir", str(tmp_path / "coordinator")
    )
    assert rc == 1, log
    assert "open incident inc-7 (xid79); failing" in log
    assert calls == [
        "--oneliner show node n1",
        "update NodeName=n1 State=DRAIN Reason=recover: xid79 (incident inc-7, epilog)",
    ]


def test_an_incident_that_keeps_the_node_passes_without_draining(
    tmp_path: Path, coordinator: Coordinator
) -> None:
    """XID 94 (restart-app): the node stays in service. A failed Epilog would make Slurm
    drain it; passing leaves the expedited job held for the coordinator's requeue."""
    coordinator.incidents = [incident("n1", "xid94", "restart-app")]
    rc, log, calls = run_epilog(
        tmp_path, "34304", "--coordinator-dir", str(tmp_path / "coordinator")
    )
    assert rc == 0, log
    assert "keeps the node (restart-app); passing" in log
    assert calls == []


def test_a_node_the_coordinator_took_out_keeps_its_reason(
    tmp_path: Path, coordinator: Coordinator
) -> None:
    coordinator.incidents = [incident("n1")]
    shows = "DOWN Reason=recover: xid79 GPU has fallen off the bus"
    rc, _, calls = run_epilog(
        tmp_path, "34304", "--coordinator-dir", str(tmp_path / "coordinator"), shows=shows
    )
    assert rc == 1  # still fails: Slurm requeues the job (if the DOWN did not already)
    assert calls == ["--oneliner show node n1"]


def test_a_job_that_ended_well_passes_without_asking(
    tmp_path: Path, coordinator: Coordinator
) -> None:
    coordinator.incidents = [incident("n1")]
    rc, _, calls = run_epilog(tmp_path, "0", "--coordinator-dir", str(tmp_path / "coordinator"))
    assert (rc, calls, coordinator.asked) == (0, [], [])


def test_no_incident_on_this_node_passes_after_the_wait(
    tmp_path: Path, coordinator: Coordinator
) -> None:
    coordinator.incidents = [incident("n2")]
    args = [
        "--coordinator",
        coordinator.url,
        "--token-file",
        str(tmp_path / "coordinator" / "tokens"),
    ]
    rc, _, calls = run_epilog(tmp_path, "256", *args, "--wait", "0.3")
    assert (rc, calls) == (0, [])
    assert len(coordinator.asked) >= 2  # asked again while waiting for a report on its way
    assert all(p == "/v1/incidents?open=true" for p in coordinator.asked)


def test_another_faulted_node_of_the_job_ends_the_wait_at_once(
    tmp_path: Path, coordinator: Coordinator
) -> None:
    coordinator.incidents = [incident("n2")]
    args = ["--coordinator-dir", str(tmp_path / "coordinator"), "--wait", "30"]
    rc, _, calls = run_epilog(tmp_path, "256", *args, nodelist="n[1-2]")
    assert (rc, calls) == (0, [])
    assert len(coordinator.asked) == 1  # no wait: n2's own Epilog is the one that fails


def test_hostlists_expand_with_the_standard_library_alone() -> None:
    assert agents.epilog.expand_hostlist("node[1-3,05],spare1") == {
        "node1",
        "node2",
        "node3",
        "node05",
        "spare1",
    }


def test_no_coordinator_passes(tmp_path: Path) -> None:
    rc, log, calls = run_epilog(
        tmp_path, "256", "--coordinator", "http://127.0.0.1:9", "--token-file", "/nonexistent"
    )
    assert (rc, calls) == (0, [])
    assert "passing" in log
    d = tmp_path / "gone"
    rc, log, _ = run_epilog(tmp_path, "256", "--coordinator-dir", str(d))
    assert rc == 0
    assert "no coordinator to ask" in log
