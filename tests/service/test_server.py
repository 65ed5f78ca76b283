"""Running the app: serve() in its own process stops cleanly on SIGTERM; the test thread
server leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from recovery.service.server import free_port
from tests.service.helpers import ADMIN_TOKEN, auth, event_json, running_api

SERVE = """
import sys
from pathlib import Path
from recovery.ports.clock import SystemClock
from recovery.service.app import create_app
from recovery.service.journal import SqliteJournal
from recovery.service.server import serve
from tests.service.helpers import FakeCoordinator, tokens

journal = SqliteJournal(Path(sys.argv[1]), SystemClock())
clock = SystemClock()
app = create_app(journal=journal, tokens=tokens(), coordinator=FakeCoordinator(), clock=clock)
serve(app, port=int(sys.argv[2]), log_level="warning")
journal.close()
print("closed", flush=True)
"""


def _wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.02)  # not listening yet: poll again
    raise AssertionError(f"{url} never became healthy")


def test_serve_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(tmp_path / "j.db"), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        _wait_healthy(url, proc)
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
