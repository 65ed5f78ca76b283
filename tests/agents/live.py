"""Helpers for the agent's end-to-end tests: a real coordinator API (uvicorn in a thread over a
real SQLite journal, with the service tests' fake CoordinatorApi) that can be stopped and
started again on the same port, and agents as real processes (``python -m agents run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from recovery.ports.clock import SystemClock
from service.httpapi.agents_api import AgentChannel
from service.httpapi.app import create_app
from service.httpapi.auth import format_tokens
from service.httpapi.server import ServerThread, free_port
from service.journaldb.journal import SqliteJournal
from tests.agents.helpers import wait_for
from tests.service.helpers import ADMIN_TOKEN, NODE_TOKENS, FakeCoordinator, tokens

REPO = Path(__file__).resolve().parents[2]


class LiveCoordinator:
    """The coordinator's API on a fixed loopback port; :meth:`stop` / :meth:`start` simulate an
    outage (the journal stays open in between, as a restarted coordinator reopens it)."""

    def __init__(self, root: Path, *, connected_within_s: float = 10.0) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.journal = SqliteJournal(root / "journal.db", SystemClock())
        self.coordinator = FakeCoordinator()
        self.tokens_file = root / "tokens"
        self.tokens_file.write_text(format_tokens(tokens()))
        self.admin_token = ADMIN_TOKEN
        self.node_tokens = NODE_TOKENS
        self._connected_within_s = connected_within_s
        self._server: ServerThread | None = None
        self.channel: AgentChannel | None = None

    def start(self) -> None:
        clock = SystemClock()
        self.channel = AgentChannel.default(clock)
        self.channel.broker.connected_within_s = self._connected_within_s
        app: Any = create_app(
            journal=self.journal,
            tokens=tokens(),
            coordinator=self.coordinator,
            clock=clock,
            agents=self.channel,
        )
        self._server = ServerThread(app, port=self.port)
        self._server.__enter__()

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.broker.close()  # held polls end, or uvicorn waits for them
        if self._server is not None:
            self._server.__exit__(None, None, None)
            self._server = None

    def close(self) -> None:
        self.stop()
        self.journal.close()

    def stored_ids(self) -> list[str]:
        return [s.event.id for s, _ in self.journal.history()]

    def stored(self) -> list[Any]:
        return [s.event for s, _ in self.journal.history()]

    def duplicates(self) -> int:
        """Events received since the last start whose id the journal already had (what an
        agent sent twice), from the API's own metrics."""
        with httpx.Client(base_url=self.url, timeout=10) as http:
            text = http.get("/metrics").text
        for line in text.splitlines():
            if line.startswith('recover_intake_events_total{outcome="duplicate"}'):
                return int(float(line.split()[-1]))
        return 0


class AgentProcess:
    """``python -m agents run`` for ``node`` in a child process; its log goes to a file (a
    pipe nobody reads would fill up and stall it)."""

    def __init__(
        self,
        live: LiveCoordinator,
        node: str,
        root: Path,
        *extra: str,
        sources: str = "",
        kmsg_from: str = "start",
    ) -> None:
        self.node = node
        self.kmsg = root / f"{node}.kmsg"
        self.spool = root / f"{node}-spool"
        self.log_path = root / f"{node}.log"
        self.argv = [
            sys.executable, "-m", "agents", "run",
            "--node", node,
            "--coordinator", live.url,
            "--token-file", str(live.tokens_file),
            "--sources", sources or "kmsg,inject",
            "--spool", str(self.spool),
            "--kmsg-file", str(self.kmsg),
            "--heartbeat", "0.5",
            "--kmsg-from", kmsg_from,  # a simulated node's log starts empty: read all of it
            *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        self.kmsg.touch()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, env=env, cwd=REPO)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the exit; returns its status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spool_empty(self) -> bool:
        """Nothing waits in the spool: every event was acknowledged."""
        return not any(p.name[:1].isdigit() for p in self.spool.glob("*.json"))

    def write_lines(self, lines: list[str]) -> None:
        with open(self.kmsg, "a") as f:
            f.write("".join(line + "\n" for line in lines))


def wait_connected(live: LiveCoordinator, node: str, agent: AgentProcess) -> None:
    """Until the coordinator counts ``node``'s agent as connected (it has long-polled)."""

    def connected() -> bool:
        if not agent.alive():
            raise AssertionError(f"agent {node} exited:\n{agent.log()}")
        return live.channel is not None and live.channel.broker.connected(node)

    wait_for(connected, f"agent {node} to poll for commands", timeout_s=30)
