"""Intake speed: the real HTTP server against a load generator in another process.

Run (see ``benchmarks/README.md``)::

    .venv/bin/python -m benchmarks.intake_bench [--seconds 10] [--connections 64]
        [--batch 100] [--dir DIR] [--pin] [--json out.json]

The server process is what the coordinator runs: ``create_app`` over a ``SqliteJournal``
(WAL, ``synchronous=FULL``, group commit) served by uvicorn (uvloop, httptools) on loopback,
with a coordinator stand-in whose ``submit`` only counts. This process is the load generator:
raw asyncio HTTP/1.1 over ``--connections`` keep-alive connections, each sending its next
request as soon as the previous answer arrived (closed loop), so latency is the time from
writing the request to reading the whole response. Two phases, each ``--seconds`` long after
a one-second warm-up: one event per POST, then ``--batch`` events per POST. Every event id is
unique; at the end the journal is opened and must hold every acknowledged event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from service.httpapi.server import free_port

TARGET_SINGLE_RPS = 2_000
TARGET_SINGLE_P99_S = 0.100
TARGET_BATCH_EPS = 30_000
ADMIN = "bench-admin-token-000000000000"
MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def node_token(i: int) -> str:
    return f"bench-node-token-{i:04d}-0000000000"


# --- the server process ----------------------------------------------------------------------


class CountingCoordinator:
    """The coordinator stand-in: takes submitted events and counts them."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, events: Any) -> None:
        self.submitted += len(events)

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def status(self) -> dict[str, Any]:
        return {"submitted": self.submitted}

    def repaired(self, node: str) -> dict[str, Any]:
        return {}

    def breaker(self) -> dict[str, Any]:
        return {}

    def breaker_reset(self) -> dict[str, Any]:
        return {}

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        return {}

    def look_at_node(self, node: str) -> dict[str, Any]:
        return {}


def run_server(db: Path, port: int, nodes: int) -> None:
    from recovery.ports.clock import SystemClock
    from service.httpapi.app import create_app
    from service.httpapi.auth import TokenTable
    from service.httpapi.server import serve
    from service.journaldb.journal import SqliteJournal

    clock = SystemClock()
    journal = SqliteJournal(db, clock)
    tokens = TokenTable(ADMIN, {f"n{i}": node_token(i) for i in range(nodes)})
    app = create_app(journal=journal, tokens=tokens, coordinator=CountingCoordinator(), clock=clock)
    serve(app, port=port, log_level="warning")
    journal.close()


# --- the load generator ----------------------------------------------------------------------


def event_json(eid: str, node: int) -> str:
    return (
        f'{{"id":"{eid}","node":"n{node}","source":"nvml","fault":"xid79",'
        f'"observed_at":1700000000.25,"accelerator":3,"message":"{MESSAGE}"}}'
    )


def request_template(phase: str, conn: int, per_request: int) -> tuple[bytes, bytes]:
    """(head up to the Content-Length value, body) of one connection's requests, with ``@@``
    where the request's sequence number goes: the load generator only substitutes it (at C
    speed), so its own CPU stays small next to the server's."""
    bodies = [event_json(f"{phase}-{conn}-@@-{k}", conn) for k in range(per_request)]
    body = bodies[0] if per_request == 1 else '{"events":[' + ",".join(bodies) + "]}"
    head = (
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {node_token(conn)}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    )
    return head.encode(), body.encode()


@dataclass
class Phase:
    name: str
    events_per_request: int
    seconds: float
    requests: int
    events: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu_s: float
    client_cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def eps(self) -> float:
        return self.events / self.seconds


async def _connection(
    port: int, conn: int, per_request: int, phase: str, stop_at: float, measure_from: float
) -> tuple[list[float], int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request_head, template = request_template(phase, conn, per_request)
    latencies: list[float] = []
    errors = seq = 0
    try:
        while True:
            body = template.replace(b"@@", str(seq).encode())
            seq += 1
            start = time.perf_counter()
            writer.write(b"%s%d\r\n\r\n%s" % (request_head, len(body), body))
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            end = time.perf_counter()
            if head[9:12] != b"200":
                errors += 1
            elif start >= measure_from:
                latencies.append(end - start)
            if end >= stop_at:
                return latencies, errors
    finally:
        writer.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_phase(
    port: int, pid: int, name: str, per_request: int, connections: int, seconds: float
) -> Phase:
    now = time.perf_counter()
    measure_from, stop_at = now + 1.0, now + 1.0 + seconds
    tasks = [
        asyncio.create_task(_connection(port, c, per_request, name, stop_at, measure_from))
        for c in range(connections)
    ]
    await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
    cpu_start, client_start = _cpu_seconds(pid), time.process_time()
    results = await asyncio.gather(*tasks)
    cpu, client = _cpu_seconds(pid) - cpu_start, time.process_time() - client_start
    latencies = sorted(x for lat, _ in results for x in lat)
    if not latencies:
        raise SystemExit(f"phase {name}: no request succeeded")
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return Phase(
        name=name,
        events_per_request=per_request,
        seconds=seconds,
        requests=len(latencies),
        events=len(latencies) * per_request,
        errors=sum(e for _, e in results),
        p50_ms=q[49] * 1000,
        p99_ms=q[98] * 1000,
        max_ms=latencies[-1] * 1000,
        server_cpu_s=cpu,
        client_cpu_s=client,
    )


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # uvicorn without its "standard" extra
        return asyncio.run(coro)
    return uvloop.run(coro)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)  # not listening yet
    raise SystemExit(f"server at {url} did not become healthy")


def commits(url: str) -> tuple[float, float]:
    """(transactions, requests acknowledged) so far, from the server's own metrics."""
    text = httpx.get(f"{url}/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith(
            ("recover_intake_commit_requests_count", "recover_intake_commit_requests_sum")
        ):
            key, value = line.split()
            values[key] = float(value)
    return values["recover_intake_commit_requests_count"], values[
        "recover_intake_commit_requests_sum"
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--batch", type=int, default=100, help="events per request, batch phase")
    p.add_argument("--dir", type=Path, default=None, help="where the journal goes ($TMPDIR)")
    p.add_argument("--pin", action="store_true", help="server on CPU 0, load on CPU 1")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--serve", nargs=2, metavar=("DB", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        run_server(Path(args.serve[0]), int(args.serve[1]), args.connections)
        return 0

    work = Path(tempfile.mkdtemp(prefix="intake-bench-", dir=args.dir))
    db, port = work / "journal.db", free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.intake_bench",
        "--serve",
        str(db),
        str(port),
        "--connections",
        str(args.connections),
    ]
    server = subprocess.Popen(cmd)
    try:
        if args.pin:
            os.sched_setaffinity(server.pid, {0})
            os.sched_setaffinity(0, {1})
        wait_healthy(url, server)
        phases = []
        for name, per in (("single", 1), ("batch", args.batch)):
            before = commits(url)
            phase = _run(run_phase(port, server.pid, name, per, args.connections, args.seconds))
            after = commits(url)
            phases.append((phase, (after[0] - before[0], after[1] - before[1])))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    conn = sqlite3.connect(db)
    stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.close()
    report(args, phases, stored, work)
    return 0


def report(
    args: argparse.Namespace,
    phases: list[tuple[Phase, tuple[float, float]]],
    stored: int,
    work: Path,
) -> None:
    print(
        f"intake: {args.connections} keep-alive connections, {args.seconds:g} s per phase, "
        f"journal {work / 'journal.db'} (WAL, synchronous=FULL)"
    )
    print(
        f"{'phase':<8} {'req/s':>9} {'events/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'req/commit':>10} {'srv cpu':>8} {'us/req':>7} {'load cpu':>8} {'errors':>6}"
    )
    for ph, (txns, reqs) in phases:
        per_commit = reqs / txns if txns else 0.0
        cpu_us = ph.server_cpu_s / ph.requests * 1e6
        srv, load = ph.server_cpu_s / ph.seconds, ph.client_cpu_s / ph.seconds
        print(
            f"{ph.name:<8} {ph.rps:>9.0f} {ph.eps:>10.0f} {ph.p50_ms:>8.2f} {ph.p99_ms:>8.2f} "
            f"{ph.max_ms:>8.2f} {per_commit:>10.1f} {srv:>8.0%} {cpu_us:>7.0f} {load:>8.0%} "
            f"{ph.errors:>6}"
        )
    single, batch = phases[0][0], phases[1][0]
    acked = sum(ph.events for ph, _ in phases)
    targets = [
        ("single POSTs/s >= 2000", single.rps / TARGET_SINGLE_RPS, single.rps >= TARGET_SINGLE_RPS),
        (
            "single p99 < 100 ms",
            TARGET_SINGLE_P99_S * 1000 / single.p99_ms,
            single.p99_ms < TARGET_SINGLE_P99_S * 1000,
        ),
        ("batched events/s >= 30000", batch.eps / TARGET_BATCH_EPS, batch.eps >= TARGET_BATCH_EPS),
    ]
    print("targets (ratio > 1 is better than the target):")
    for label, ratio, met in targets:
        print(f"  [{'met' if met else 'MISSED'}] {label}: {ratio:.2f}x")
    print(
        f"journal holds {stored} events; {acked} were acknowledged in the measured windows "
        "(plus warm-up)"
    )
    if stored < acked:
        raise SystemExit("the journal lost acknowledged events")
    if args.json:
        doc = {
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "cpus": os.cpu_count(),
            "phases": [
                {
                    **asdict(ph),
                    "rps": ph.rps,
                    "eps": ph.eps,
                    "commits": txns,
                    "requests_per_commit": reqs / txns if txns else None,
                }
                for ph, (txns, reqs) in phases
            ],
            "targets": [{"target": t, "ratio": r, "met": m} for t, r, m in targets],
            "stored_events": stored,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
