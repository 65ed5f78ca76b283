"""The agent benchmark's rig: the engine observer that stamps each event's commit and
decision, the agent processes it starts, and /proc readings (``agent_bench`` uses these)."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from recovery.model import Decision, HealthEvent
from service.httpapi.auth import TokenTable, format_tokens

NODE = "node1"  # the local cluster's node name
ADMIN = "bench-admin-token-000000000000"
NODE_TOKEN = "bench-node-token-0000000000000"  # noqa: S105 (a benchmark token)
GPUS = 256
_MARKER = re.compile(r"\[agent-bench (\S+)\]")


class Stamps:
    """The engine's observer (:class:`recovery.coordinator.engine.Observer`): notes
    (monotonic) when each event id was committed by the intake (``submitted``) and when its
    decision was committed to the journal (``decided``); events are also found by the
    ``[agent-bench MARK]`` marker in their text."""

    def __init__(self) -> None:
        self.committed: dict[str, float] = {}
        self.decided_at: dict[str, float] = {}
        self.by_marker: dict[str, str] = {}
        self.arrived = threading.Condition()

    def submitted(self, events: Sequence[HealthEvent]) -> None:
        now = time.monotonic()
        with self.arrived:
            for e in events:
                self.committed.setdefault(e.id, now)
                m = _MARKER.search(e.message)
                if m:
                    self.by_marker.setdefault(m[1], e.id)

    def decided(self, decisions: Sequence[Decision]) -> None:
        now = time.monotonic()
        with self.arrived:
            for d in decisions:
                self.decided_at.setdefault(d.event_id, now)
            self.arrived.notify_all()

    def wait(self, event_id: str, timeout_s: float = 30.0) -> tuple[float, float]:
        """(committed, decided) monotonic times of ``event_id``."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: event_id in self.decided_at, timeout_s):
                raise SystemExit(f"event {event_id} was never decided")
            decided = self.decided_at[event_id]
            return self.committed.get(event_id, decided), decided

    def wait_marker(self, marker: str, timeout_s: float = 30.0) -> tuple[float, float] | None:
        """Like :meth:`wait` for the event whose text carries ``marker``; None on timeout."""
        with self.arrived:
            ok = self.arrived.wait_for(
                lambda: self.by_marker.get(marker) in self.decided_at, timeout_s
            )
            if not ok:
                return None
            eid = self.by_marker[marker]
            return self.committed[eid], self.decided_at[eid]


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def quantiles(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"n": len(samples), "p50_s": q[49], "p99_s": q[98], "max_s": max(samples)}


def start_agent(
    root: Path, url: str, name: str, sources: str, kmsg: Path, kmsg_from: str
) -> subprocess.Popen[bytes]:
    """A real agent for ``NODE`` with its own spool and log under ``root/name``."""
    (root / "tokens").write_text(format_tokens(TokenTable(ADMIN, {NODE: NODE_TOKEN})))
    home = root / name
    home.mkdir(exist_ok=True)
    argv = [
        sys.executable, "-m", "agents", "run", "--node", NODE, "--coordinator", url,
        "--token-file", str(root / "tokens"), "--sources", sources,
        "--spool", str(home / "spool"), "--kmsg-file", str(kmsg),
        "--simulated-gpus", str(GPUS), "--dedup-window", "600", "--kmsg-from", kmsg_from,
    ]  # fmt: skip
    log = open(home / "agent.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(argv, stdout=log, stderr=log)


def stop_agent(agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    agent.wait(30)


def wait_connected(url: str, pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agents = httpx.get(f"{url}/v1/agents", headers={"Authorization": f"Bearer {ADMIN}"})
        if any(a["connected"] for a in agents.json()):
            return
        time.sleep(0.05)
    raise SystemExit(f"the agent (pid {pid}) never polled; see its log")
