"""Durable before acknowledged, through HTTP: the server process is SIGKILLed while agents
post events; every event that got a 200 is in the journal afterwards, exactly once."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from recovery.ports.clock import FakeClock
from service.httpapi.server import free_port
from service.journaldb.journal import SqliteJournal
from tests.service.helpers import ADMIN_TOKEN, auth, event_json, start_server, wait_healthy

AGENTS = 8


def _post_until_refused(url: str, agent: int, acked: list[str], sent: list[str]) -> None:
    """One agent: post small batches until the server is gone; record what got a 200."""
    with httpx.Client(base_url=url, headers=auth(ADMIN_TOKEN), timeout=10) as client:
        for n in range(100_000):
            ids = [f"a{agent}-{n}-{k}" for k in range(1 + n % 4)]
            sent.extend(f"ev-{i}" for i in ids)
            body = {"events": [event_json(i, node=f"n{agent}") for i in ids]}
            try:
                r = client.post("/v1/events", json=body)
            except httpx.TransportError:
                return
            assert r.status_code == 200, r.text
            acked.extend(r.json()["accepted"])


def _run_and_kill(path: Path, rng: random.Random) -> tuple[set[str], set[str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(path, port)
    acked: list[str] = []
    sent: list[str] = []
    try:
        wait_healthy(url, proc)
        agents = [
            threading.Thread(target=_post_until_refused, args=(url, a, acked, sent))
            for a in range(AGENTS)
        ]
        for t in agents:
            t.start()
        deadline = time.monotonic() + 30
        target = rng.randint(20, 300)  # kill after about this many acknowledgements
        while len(acked) < target and time.monotonic() < deadline:
            time.sleep(0.002)  # poll the acknowledgement count
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    for t in agents:
        t.join()
    assert proc.returncode == -signal.SIGKILL
    return set(acked), set(sent)


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_sigkilled_server_kept_every_acknowledged_event(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "journal.db"
    acked, sent = _run_and_kill(path, random.Random(seed))
    assert len(acked) >= 20
    journal = SqliteJournal(path, FakeClock())
    try:
        stored = [s.event.id for s, _ in journal.history()]
    finally:
        journal.close()
    assert len(stored) == len(set(stored)), "an event was stored twice"
    missing = acked - set(stored)
    assert not missing, f"{len(missing)} acknowledged events lost, e.g. {sorted(missing)[:5]}"
    assert set(stored) <= sent
