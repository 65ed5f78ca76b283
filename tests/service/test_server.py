"""Running the app: serve() in its own process stops cleanly on SIGTERM; the test thread
server leaves nothing behind."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx

from service.httpapi.server import free_port
from tests.service.helpers import (
    ADMIN_TOKEN,
    auth,
    event_json,
    running_api,
    start_server,
    wait_healthy,
)


def test_serve_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(tmp_path / "j.db", port)
    try:
        wait_healthy(url, proc)
        r = httpx.post(f"{url}/v1/events", json=event_json(1), headers=auth(ADMIN_TOKEN))
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.split() == ["closed"]


def test_thread_server_leaves_no_thread(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with running_api(tmp_path) as api:
        api.client.post("/v1/events", json=event_json(1), headers=auth(ADMIN_TOKEN))
        url = api.url
    assert set(threading.enumerate()) <= before, "uvicorn and the commit thread are gone"
    try:
        httpx.get(f"{url}/healthz", timeout=1)
        raise AssertionError("still listening")
    except httpx.ConnectError:
        pass
