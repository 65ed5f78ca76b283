"""Node agent: detection latency per kernel-log source to the coordinator's journal, and what
the agent costs.

Run (see ``benchmarks/README.md``)::

    .venv/bin/python -m benchmarks.agent_bench [--injections 200] [--idle-seconds 5]
        [--flood 10000] [--no-kernel-log] [--dir DIR] [--json out.json]

This process runs the coordinator: its API (``create_app`` over a ``SqliteJournal``, uvicorn on
loopback) and the real engine (default policy), on the real local Slurm cluster (one node,
started here) when run as root with Slurm installed, else on a FakeSlurm. Each event is
stamped when the intake committed it and when the engine's decision on it was committed; the
figures are to the decision, with the commit alongside. Each path runs its own real
``python -m agents run`` process, one after the other:

* ``kmsg-file``: a genuine ``NVRM: Xid ...`` line appended to a plain file the agent follows
  (a simulated node's kernel log); from just before the write to the commit of the event id
  the parser derives from the line.
* ``kmsg-device``: the line written to the real ``/dev/kmsg`` (root) and read by the agent
  record by record; the event is found by a marker in its text.
* ``journald``: the line written to ``/dev/kmsg``, stored by the running journald and read by
  the agent's ``journalctl -k -f -o json``.
* ``agent``: ``POST /v1/inject`` (admin, ``via agent``); from just before the request to the
  commit of the event id the reply names (the command channel's round trip included).

The two kernel paths write marked lines (``[agent-bench ...]``, made-up bus ids) into this
machine's kernel log; ``--no-kernel-log`` leaves them out, and each is skipped, with the
reason printed, where it cannot run (not root, no journald). Injections go one at a time (each
waits for its commit) on distinct GPUs, so none is folded. Cost: CPU seconds and RSS of the
file agent idle for ``--idle-seconds``, then over a ``--flood``-line XID flood written at once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from agents.faultline import format_fault_line
from agents.ids import read_boot_id
from agents.inject import simulated_bus
from agents.kmsg import kmsg_event_id, parse_line
from benchmarks.agent_rig import (
    ADMIN,
    GPUS,
    NODE,
    NODE_TOKEN,
    Stamps,
    proc_cpu_s,
    proc_rss_mib,
    quantiles,
    start_agent,
    stop_agent,
    wait_connected,
)
from recovery.coordinator.build import build_engine
from recovery.coordinator.rules import Rules
from recovery.policy import PolicyConfig, load_catalogue
from recovery.ports.clock import SystemClock
from service.httpapi.app import create_app
from service.httpapi.auth import TokenTable
from service.httpapi.server import ServerThread
from service.journaldb.journal import SqliteJournal

#: The issue's targets, fault -> coordinator decision recorded.
TARGET_P50_S = 0.100
TARGET_P99_S = 0.500
#: The agent's default kernel-log read interval (``--kmsg-interval``), seconds.
KMSG_INTERVAL_S = 0.05
PATHS = ("kmsg-file", "kmsg-device", "journald", "agent")


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


Samples = tuple[list[float], list[float]]


def pause(rng: random.Random) -> None:
    # A fault does not wait for the agent's next read of the log: without a random pause each
    # write would come just after a read, and every sample would include a whole read
    # interval instead of half of one on average.
    time.sleep(rng.uniform(0, KMSG_INTERVAL_S))


def file_latencies(stamps: Stamps, kmsg: Path, n: int, seed: int) -> Samples:
    boot, committed, decided = read_boot_id(), [], []
    rng = random.Random(seed)
    with open(kmsg, "a") as f:
        for i in range(n):
            pause(rng)
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


def kernel_latencies(stamps: Stamps, path: str, n: int, seed: int) -> Samples:
    """Lines written to /dev/kmsg, found by their markers. A first line (not counted) is
    written again until the agent reports one: its source is then surely reading."""
    run = f"{uuid.uuid4().hex[:8]}-{path}"

    def write(i: int, tag: str) -> float:
        message = format_fault_line("xid79", simulated_bus(i % GPUS), note=f"agent-bench {tag}")
        # A descriptor of its own per line: the kernel lets one descriptor write only 10 lines
        # per 5 s (printk_devkmsg=ratelimit) and drops the rest.
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            start = time.monotonic()
            os.write(fd, f"<4>{message}\n".encode())  # the newline ends the record at once
        finally:
            os.close(fd)
        return start

    for attempt in range(60):
        write(GPUS - 1, f"{run}-w{attempt}")
        if stamps.wait_marker(f"{run}-w{attempt}", timeout_s=1.0) is not None:
            break
    else:
        raise SystemExit(f"{path}: the agent reported none of the warm-up lines")
    rng, committed, decided = random.Random(seed), [], []
    for i in range(n):
        pause(rng)
        start = write(i, f"{run}-{i}")
        got = stamps.wait_marker(f"{run}-{i}")
        if got is None:
            raise SystemExit(f"{path}: line {i} was never decided")
        committed.append(got[0] - start)
        decided.append(got[1] - start)
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


def kernel_log_unavailable(path: str, enabled: bool) -> str | None:
    """Why the ``kmsg-device`` or ``journald`` path cannot run here (None: it can)."""
    if not enabled:
        return "--no-kernel-log"
    if os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK):
        return "needs root to write to /dev/kmsg"
    if path == "journald":
        if shutil.which("journalctl") is None:
            return "no journalctl here"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect("/run/systemd/journal/socket")
        except OSError:
            return "no journald runs here"
        finally:
            probe.close()
    return None


def run_paths(args: argparse.Namespace, root: Path, url: str, stamps: Stamps) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    kmsg = root / "kmsg"
    kmsg.touch()
    agent = start_agent(root, url, "file", "kmsg,inject", kmsg, "start")
    try:
        wait_connected(url, agent.pid)
        k = file_latencies(stamps, kmsg, args.injections, args.seed)
        a = agent_latencies(stamps, url, args.injections)
        figures["cost"] = cost(agent.pid, stamps, kmsg, args.idle_seconds, args.flood)
    finally:
        stop_agent(agent)
    figures["kmsg-file"] = {**quantiles(k[1]), "to_commit": quantiles(k[0])}
    figures["agent"] = {**quantiles(a[1]), "to_commit": quantiles(a[0])}
    for path, sources in (("kmsg-device", "kmsg,inject"), ("journald", "journald,inject")):
        why = kernel_log_unavailable(path, args.kernel_log)
        if why is not None:
            figures[path] = {"skipped": why}
            continue
        agent = start_agent(root, url, path, sources, Path("/dev/kmsg"), "end")
        try:
            wait_connected(url, agent.pid)
            c, d = kernel_latencies(stamps, path, args.injections, args.seed)
        finally:
            stop_agent(agent)
        figures[path] = {**quantiles(d), "to_commit": quantiles(c)}
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--injections", type=int, default=200, help="per path (>= 200 for p99)")
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--flood", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0, help="for the pauses between kernel lines")
    p.add_argument(
        "--no-kernel-log",
        dest="kernel_log",
        action="store_false",
        help="do not write lines into this machine's kernel log (skips kmsg-device, journald)",
    )
    p.add_argument("--dir", type=Path, default=None, help="journal, spools, kernel log file")
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
    try:
        engine.start()
        with ServerThread(app) as server:
            try:
                figures = {"slurm": where, **run_paths(args, root, server.url, stamps)}
            finally:
                app.state.agents.broker.close()
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
        f"{'path':<12}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'p50/t':>8}{'p99/t':>8}"
    )
    for path in PATHS:
        f = figures[path]
        if "skipped" in f:
            rows.append(f"{path:<12}  skipped: {f['skipped']}")
            continue
        f["p50_ratio"], f["p99_ratio"] = f["p50_s"] / TARGET_P50_S, f["p99_s"] / TARGET_P99_S
        c = f["to_commit"]
        rows.append(
            f"{path:<12}{f['n']:>6}{f['p50_s'] * 1e3:>10.1f}{f['p99_s'] * 1e3:>10.1f}"
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
