"""Node agent: detection latency to the coordinator's journal, and what the agent costs.

Run (see ``benchmarks/README.md``)::

    .venv/bin/python -m benchmarks.agent_bench [--injections 200] [--idle-seconds 5]
        [--flood 10000] [--dir DIR] [--json out.json]

This process runs the coordinator: its API (``create_app`` over a ``SqliteJournal``, uvicorn on
loopback) and the real engine (default policy), on the real local Slurm cluster (one node,
started here) when run as root with Slurm installed, else on a FakeSlurm. Each event id is
stamped when the intake committed it and when the engine's decision on it was committed; the
figures are to the decision, with the commit alongside. The agent is a real
``python -m agents run`` process following a plain file as its kernel log.

* ``kmsg``: a genuine ``NVRM: Xid ...`` line is appended to the agent's kernel log; latency is
  from just before that write to the commit of the event id the parser derives from the line.
* ``agent``: ``POST /v1/inject`` (admin, ``via agent``); latency is from just before the request
  to the commit of the event id the reply names: the command channel's round trip included.

Injections go one at a time (each waits for its commit) on distinct GPUs, so none is folded by
the deduplicator. Cost: CPU seconds and RSS of the agent idle for ``--idle-seconds``, then over a
``--flood``-line XID flood written at once, from the write until the first event is committed
and the agent's CPU use has settled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agents.follow import format_fault_line
from agents.ids import read_boot_id
from agents.inject import simulated_bus
from agents.kmsg import kmsg_event_id, parse_line
from recovery.coordinator.build import build_engine
from recovery.coordinator.rules import Rules
from recovery.httpapi.app import create_app
from recovery.httpapi.auth import TokenTable, format_tokens
from recovery.httpapi.server import ServerThread
from recovery.journaldb.journal import SqliteJournal
from recovery.model import Decision, HealthEvent
from recovery.policy import PolicyConfig, load_catalogue
from recovery.ports.clock import SystemClock

#: The issue's targets, fault -> coordinator decision recorded.
TARGET_P50_S = 0.100
TARGET_P99_S = 0.500
NODE = "node1"  # the local cluster's node name
ADMIN = "bench-admin-token-000000000000"
NODE_TOKEN = "bench-node-token-0000000000000"  # noqa: S105 (a benchmark token)
GPUS = 256
#: The agent's default kernel-log read interval (``--kmsg-interval``), seconds.
KMSG_INTERVAL_S = 0.05


class Stamps:
    """The engine's observer (:class:`recovery.coordinator.engine.Observer`): notes
    (monotonic) when each event id was committed by the intake (``submitted``) and when its
    decision was committed to the journal (``decided``, after the commit of the engine's
    decision batch)."""

    def __init__(self) -> None:
        self.committed: dict[str, float] = {}
        self.decided_at: dict[str, float] = {}
        self.arrived = threading.Condition()

    def submitted(self, events: Sequence[HealthEvent]) -> None:
        now = time.monotonic()
        with self.arrived:
            for e in events:
                self.committed.setdefault(e.id, now)

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


def slurm_for_bench(root: Path) -> tuple[Any, str, Any]:
    """The local Slurm cluster (one node) when this runs as root with Slurm installed, else a
    FakeSlurm; returns (port, what, cluster to stop or None)."""
    if os.geteuid() == 0 and shutil.which("slurmctld"):
        from slurm.cluster import LocalCluster

        cluster = LocalCluster(root / "slurm")
        cluster.up(nodes=1, spares=0)
        return cluster.control(), "the real local Slurm cluster (1 node)", cluster
    from tests.fakes.slurm import FakeSlurm

    return FakeSlurm([NODE]), "a FakeSlurm (run as root with Slurm for the real one)", None


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


def start_agent(root: Path, url: str, kmsg: Path) -> subprocess.Popen[bytes]:
    (root / "tokens").write_text(format_tokens(TokenTable(ADMIN, {NODE: NODE_TOKEN})))
    kmsg.touch()
    argv = [
        sys.executable, "-m", "agents", "run", "--node", NODE, "--coordinator", url,
        "--token-file", str(root / "tokens"), "--sources", "kmsg,inject",
        "--spool", str(root / "spool"), "--kmsg-file", str(kmsg),
        "--simulated-gpus", str(GPUS), "--dedup-window", "600", "--kmsg-from", "start",
    ]  # fmt: skip
    log = open(root / "agent.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(argv, stdout=log, stderr=log)


def wait_connected(url: str, pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agents = httpx.get(f"{url}/v1/agents", headers={"Authorization": f"Bearer {ADMIN}"})
        if any(a["connected"] for a in agents.json()):
            return
        time.sleep(0.05)
    raise SystemExit(f"the agent (pid {pid}) never polled; see its log")


Samples = tuple[list[float], list[float]]


def kmsg_latencies(stamps: Stamps, kmsg: Path, n: int, seed: int) -> Samples:
    boot, committed, decided = read_boot_id(), [], []
    rng = random.Random(seed)
    with open(kmsg, "a") as f:
        for i in range(n):
            # A fault does not wait for the agent's next read of the log: without a random
            # pause each write would come just after a read, and every sample would include a
            # whole read interval instead of half of one on average.
            time.sleep(rng.uniform(0, KMSG_INTERVAL_S))
            line = f"[{1000 + i:12.6f}] " + format_fault_line("xid79", simulated_bus(i % GPUS))
            fault = parse_line(line)
            assert fault is not None
            eid = kmsg_event_id(NODE, boot, fault)
            start = time.monotonic()
            f.write(line + "\n")
            f.flush()
            at_commit, at_decision = stamps.wait(eid)
            committed.append(at_commit - start)
            decided.append(at_decision - start)
    return committed, decided


def agent_latencies(stamps: Stamps, url: str, n: int) -> Samples:
    committed, decided = [], []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        for i in range(n):
            start = time.monotonic()
            r = http.post("/v1/inject", json={"fault": "xid48", "node": NODE, "gpu": i % 1024})
            r.raise_for_status()
            at_commit, at_decision = stamps.wait(r.json()["event_id"])
            committed.append(at_commit - start)
            decided.append(at_decision - start)
    return committed, decided


def cost(pid: int, stamps: Stamps, kmsg: Path, idle_s: float, flood: int) -> dict[str, Any]:
    cpu0, t0 = proc_cpu_s(pid), time.monotonic()
    time.sleep(idle_s)  # a benchmark measures over wall time; nothing is waited on here
    idle_cpu = proc_cpu_s(pid) - cpu0
    idle = {
        "seconds": idle_s,
        "cpu_percent": 100 * idle_cpu / (time.monotonic() - t0),
        "rss_mib": proc_rss_mib(pid),
    }
    bus = simulated_bus(GPUS - 1)
    lines = [f"[{5000 + i / 1000:12.6f}] " + format_fault_line("xid95", bus) for i in range(flood)]
    first = parse_line(lines[0])
    assert first is not None
    eid = kmsg_event_id(NODE, read_boot_id(), first)
    cpu0, t0 = proc_cpu_s(pid), time.monotonic()
    with open(kmsg, "a") as f:
        f.write("\n".join(lines) + "\n")
    stamps.wait(eid)
    first_s = time.monotonic() - t0
    last = proc_cpu_s(pid)
    while True:  # until a quarter second passes with no more CPU used than an idle agent's
        time.sleep(0.25)
        now = proc_cpu_s(pid)
        if now - last <= max(0.02, idle_cpu / idle_s * 0.25 * 2):
            break
        last = now
    return {
        "idle": idle,
        "flood": {
            "lines": flood,
            "first_event_s": first_s,
            "cpu_s": proc_cpu_s(pid) - cpu0,
            "cpu_us_per_line": 1e6 * (proc_cpu_s(pid) - cpu0) / flood,
            "rss_mib": proc_rss_mib(pid),
            "peak_rss_mib": proc_rss_mib(pid, "VmHWM"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--injections", type=int, default=200, help="per path (>= 200 for p99)")
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--flood", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0, help="for the pauses between kernel lines")
    p.add_argument("--dir", type=Path, default=None, help="journal, spool, kernel log")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="agent-bench-", dir=args.dir))
    clock = SystemClock()
    journal = SqliteJournal(root / "journal.db", clock)
    slurm, where, cluster = slurm_for_bench(root)
    print(f"coordinator engine on {where}", file=sys.stderr)
    stamps = Stamps()
    engine = build_engine(
        journal=journal,
        slurm=slurm,
        clock=clock,
        rules=Rules(PolicyConfig.default(), load_catalogue()),
        observer=stamps,
    )
    app = create_app(
        journal=journal,
        tokens=TokenTable(ADMIN, {NODE: NODE_TOKEN}),
        coordinator=engine,
        clock=clock,
    )
    kmsg = root / "kmsg"
    try:
        engine.start()
        with ServerThread(app) as server:
            agent = start_agent(root, server.url, kmsg)
            try:
                wait_connected(server.url, agent.pid)
                k_commit, k_decide = kmsg_latencies(stamps, kmsg, args.injections, args.seed)
                a_commit, a_decide = agent_latencies(stamps, server.url, args.injections)
                figures = {
                    "slurm": where,
                    "kmsg": quantiles(k_decide),
                    "agent": quantiles(a_decide),
                    "kmsg_to_commit": quantiles(k_commit),
                    "agent_to_commit": quantiles(a_commit),
                    "cost": cost(agent.pid, stamps, kmsg, args.idle_seconds, args.flood),
                }
            finally:
                app.state.agents.broker.close()
                agent.terminate()
                agent.wait(30)
    finally:
        engine.stop()
        journal.close()
        if cluster is not None:
            cluster.down()
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


def report(figures: dict[str, Any]) -> str:
    rows = [
        f"detection latency, written/requested -> decision recorded by the real engine on "
        f"{figures['slurm']} (one at a time; in brackets: to the event's journal commit)"
    ]
    rows.append(
        f"{'path':<8}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'p50/t':>8}{'p99/t':>8}"
    )
    for path in ("kmsg", "agent"):
        f = figures[path]
        f["p50_ratio"], f["p99_ratio"] = f["p50_s"] / TARGET_P50_S, f["p99_s"] / TARGET_P99_S
        c = figures[f"{path}_to_commit"]
        rows.append(
            f"{path:<8}{f['n']:>6}{f['p50_s'] * 1e3:>10.1f}{f['p99_s'] * 1e3:>10.1f}"
            f"{f['max_s'] * 1e3:>10.1f}{f['p50_ratio']:>8.2f}{f['p99_ratio']:>8.2f}"
            f"   [{c['p50_s'] * 1e3:.1f} / {c['p99_s'] * 1e3:.1f} ms]"
        )
    rows.append(f"targets: p50 <= {TARGET_P50_S * 1e3:.0f} ms, p99 <= {TARGET_P99_S * 1e3:.0f} ms")
    idle, flood = figures["cost"]["idle"], figures["cost"]["flood"]
    rows.append(
        f"agent idle: {idle['cpu_percent']:.2f}% of a core over {idle['seconds']:g} s, "
        f"RSS {idle['rss_mib']:.1f} MiB"
    )
    rows.append(
        f"agent flood of {flood['lines']} lines: first event committed after "
        f"{flood['first_event_s'] * 1e3:.0f} ms; {flood['cpu_s']:.2f} CPU s "
        f"({flood['cpu_us_per_line']:.0f} us/line); RSS {flood['rss_mib']:.1f} MiB, "
        f"peak {flood['peak_rss_mib']:.1f} MiB"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
