"""The decision benchmark's HTTP path (``decision_bench --http``): the storm goes through the
real intake.

The server process is what ``recover coordinator serve`` runs, with the timed fake Slurm in
place of the real one: ``create_app`` over the engine and a ``SqliteJournal``, a token per
node, under uvicorn on loopback. This process is the agents: one POST per failed node with
that node's token, spread over ``--spread-s`` on up to 64 connections. The figures are read
from the journal, which this process opens alongside the server (SQLite WAL allows it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks.decision_rig import (
    STOP_WAIT_S,
    Latencies,
    Options,
    Result,
    build_rig,
    measure,
    result,
    settled,
    slurm_counts,
    storm,
    wait_until,
)
from recovery.coordinator.views import LAYOUT_KEY
from recovery.model import HealthEvent
from recovery.ports.clock import SystemClock
from service.httpapi.server import free_port
from service.journaldb.journal import SqliteJournal

ADMIN = "bench-admin-token-000000000000"
CONNECTIONS = 64


def node_token(node: str) -> str:
    return f"bench-token-{node}-000000000000"


def options_from_json(text: str) -> Options:
    data = json.loads(text)
    data["storms"], data["policies"] = tuple(data["storms"]), tuple(data["policies"])
    return Options(**data)


def serve(opts: Options, size: int, policy_name: str, db: Path, port: int) -> None:
    """The coordinator process: serve until SIGTERM, then print the Slurm call counts."""
    from service.httpapi.app import create_app
    from service.httpapi.auth import TokenTable
    from service.httpapi.server import serve as serve_app

    rig = build_rig(opts, size, policy_name, db)
    names = [n.name for n in rig.slurm.nodes()]
    tokens = TokenTable(ADMIN, {n: node_token(n) for n in names})
    app = create_app(journal=rig.journal, tokens=tokens, coordinator=rig.engine, clock=rig.clock)
    rig.engine.start()
    try:
        serve_app(app, port=port, log_level="warning")
    finally:
        rig.engine.stop(timeout_s=STOP_WAIT_S)
        print(json.dumps(slurm_counts(rig.slurm)), flush=True)
        rig.journal.close()


async def send(
    port: int, events: list[HealthEvent], spread_s: float
) -> list[tuple[int, float, float]]:
    """POST each event as its node's agent would, the k-th at ``k * spread_s / n``, over
    :data:`CONNECTIONS` keep-alive connections (raw HTTP/1.1: an HTTP client library's own
    CPU would be the bottleneck at 1,000 requests a second). Returns, per event, the status
    code, when it was sent (monotonic seconds) and the seconds until the whole answer."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(len(events)):
        queue.put_nowait(k)
    out: list[tuple[int, float, float]] = [(0, 0.0, 0.0)] * len(events)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not queue.empty():
                k = queue.get_nowait()
                await asyncio.sleep(max(0.0, start + k * spread_s / len(events) - loop.time()))
                ev = events[k]
                body = ev.model_dump_json().encode()
                head = (
                    "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {node_token(ev.node)}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                sent = time.monotonic()
                writer.write(head.encode() + body)
                answer = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in answer.split(b"\r\n")[1:]:
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                out[k] = (int(answer[9:12]), sent, time.monotonic() - sent)
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(min(CONNECTIONS, len(events)))))
    return out


def cpu_seconds(pid: int) -> float:
    """CPU (user + system) process ``pid`` used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_healthy(url: str, proc: subprocess.Popen[str], deadline: float) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"coordinator exited with status {proc.returncode}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False  # not listening yet

    if not wait_until(up, deadline, every_s=0.05):
        raise SystemExit(f"coordinator at {url} did not become healthy")


def run_one_http(opts: Options, size: int, policy_name: str, workdir: Path) -> Result:
    """One storm through the HTTP intake of a coordinator in its own process."""
    db, port = workdir / f"journal-http-{size}-{policy_name}.db", free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "benchmarks.decision_http", json.dumps(asdict(opts))]
    cmd += [str(size), policy_name, str(db), str(port)]
    began = time.monotonic()
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        wait_healthy(url, server, began + opts.deadline_s)
        journal = SqliteJournal(db, SystemClock(), checkpoint_every_s=None)
        wait_until(lambda: journal.get_meta(LAYOUT_KEY) is not None, began + opts.deadline_s)
        events = storm(opts, size, SystemClock())
        cpu = (time.process_time(), cpu_seconds(server.pid))
        answers = asyncio.run(send(port, events, opts.spread_s))
        cpu = (time.process_time() - cpu[0], cpu_seconds(server.pid) - cpu[1])
        codes = [c for c, _, _ in answers]
        if any(c != 200 for c in codes):
            raise SystemExit(f"the intake refused events: status codes {sorted(set(codes))}")
        finished = wait_until(lambda: settled(journal), time.monotonic() + opts.deadline_s)
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=STOP_WAIT_S + 30)
    counts: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    res = result(
        size,
        policy_name,
        journal,
        {e.id for e in events},
        finished,
        **counts,
        wall_s=time.monotonic() - began,
        path="http",
        intake={
            **Latencies([t for _, _, t in answers]).summary(),
            "load_cpu_s": cpu[0],
            "server_cpu_s": cpu[1],
        },
    )
    sent = {e.id: at for e, (_, at, _) in zip(events, answers, strict=True)}
    m = measure(journal, set(sent), sent)
    res.from_send = {"decision": m["decision"], "takedown": m["takedown"]}
    journal.close()
    return res


if __name__ == "__main__":
    raw, size, policy_name, db, port = sys.argv[1:]
    serve(options_from_json(raw), int(size), policy_name, Path(db), int(port))
