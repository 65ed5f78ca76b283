"""Helpers shared by the service tests: event and decision builders, a fake coordinator, and a
running API on loopback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from recovery.errors import UsageError, unknown_choice
from recovery.model import Decision, HealthEvent, PromoteSpare, Source, TakeDown, Verdict
from recovery.ports.clock import FakeClock
from service.httpapi.app import create_app
from service.httpapi.auth import TokenTable
from service.httpapi.fastpath import ServiceApp
from service.httpapi.server import ServerThread
from service.journaldb.journal import SqliteJournal

NODES = ("n1", "n2", "n3")
ADMIN_TOKEN = "admin-token-0123456789abcdef"  # noqa: S105 (a test token)
NODE_TOKENS = {n: f"{n}-token-0123456789abcdef" for n in NODES}


def tokens() -> TokenTable:
    return TokenTable(ADMIN_TOKEN, NODE_TOKENS)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def event(i: int | str, node: str = "n1", fault: str = "xid79", **extra: Any) -> HealthEvent:
    """A valid event; ``i`` makes the id (``ev-<i>``) and the observation time."""
    observed = float(i) if isinstance(i, int) else 1_700_000_000.0
    fields: dict[str, Any] = {
        "id": f"ev-{i}",
        "node": node,
        "source": "nvml",
        "fault": fault,
        "observed_at": 1_700_000_000.0 + observed,
        **extra,
    }
    return HealthEvent(**fields)


def event_json(i: int | str, node: str = "n1", **extra: Any) -> dict[str, Any]:
    return event(i, node, **extra).model_dump(mode="json", exclude_defaults=True)


def replace_decision(ev: HealthEvent, incident: str, *, held: bool = False) -> Decision:
    return Decision(
        event_id=ev.id,
        node=ev.node,
        fault=ev.fault,
        verdict=Verdict.replace_node,
        actions=(TakeDown(ev.node, reason=f"recover: {ev.fault}"), PromoteSpare(ev.node)),
        incident=incident,
        opens=True,
        held=held,
        why="xid79 replaces the node",
        policy_version="test-1",
    )


@dataclass
class FakeCoordinator:
    """A CoordinatorApi that records what it was given (thread-safe)."""

    nodes_known: tuple[str, ...] = NODES
    taken_out: set[str] = field(default_factory=lambda: {"n1"})
    checked: list[tuple[str, bool | None, str | None]] = field(default_factory=list)
    submitted: list[HealthEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, events: Sequence[HealthEvent]) -> None:
        with self._lock:
            self.submitted.extend(events)

    def submitted_ids(self) -> list[str]:
        with self._lock:
            return [e.id for e in self.submitted]

    def nodes(self) -> list[dict[str, Any]]:
        return [{"name": n, "state": "idle", "ours": n in self.taken_out} for n in self.nodes_known]

    def status(self) -> dict[str, Any]:
        # The shape of the real one (recovery.coordinator.views.status), trimmed.
        rows = [{"name": n, "suspect": False} for n in self.nodes_known]
        return {"nodes": rows, "spares": [], "breaker": {"tripped": False}, "dry_run": False}

    def repaired(self, node: str) -> dict[str, Any]:
        if node not in self.nodes_known:
            raise unknown_choice("node", node, self.nodes_known)
        if node not in self.taken_out:
            raise UsageError(f"node {node} was not taken out by us")
        return {"node": node, "returned": True}

    def breaker(self) -> dict[str, Any]:
        return {"window_s": 300, "held": 0}

    def breaker_reset(self) -> dict[str, Any]:
        return {"released": [], "expired": []}

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        if node not in self.nodes_known:
            raise unknown_choice("node", node, self.nodes_known)
        self.checked.append((node, burn_in, force))
        verdict = "forced" if force else "passed"
        return {"node": node, "verdict": verdict, "passed": True, "results": []}

    def look_at_node(self, node: str) -> dict[str, Any]:
        if node not in self.nodes_known:
            raise unknown_choice("node", node, self.nodes_known)
        return {"node": node, "verdict": "passed", "passed": True, "results": []}


@dataclass
class Api:
    """A real server on loopback over a real journal, and what it is wired to."""

    url: str
    app: ServiceApp
    journal: SqliteJournal
    coordinator: FakeCoordinator
    client: httpx.Client

    def stored_ids(self) -> list[str]:
        return [s.event.id for s, _ in self.journal.history()]


@contextmanager
def running_api(root: Path, *, max_body_bytes: int = 1_000_000, **kwargs: Any) -> Iterator[Api]:
    """Journal in ``root``, app, uvicorn in a thread, an httpx client; all closed after."""
    journal = SqliteJournal(root / "journal.db", FakeClock())
    coordinator = FakeCoordinator()
    app: Any = create_app(
        journal=journal,
        tokens=tokens(),
        coordinator=coordinator,
        clock=FakeClock(),
        max_body_bytes=max_body_bytes,
        **kwargs,
    )
    try:
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/healthz").status_code == 200
            yield Api(server.url, app, journal, coordinator, client)
    finally:
        journal.close()


def crash_event(i: int) -> HealthEvent:
    """Event number ``i`` of the crash tests: every field a function of ``i``."""
    return HealthEvent(
        id=f"crash-{i}",
        node=f"n{i % 5}",
        source=Source.kmsg,
        fault=f"xid{i % 160}",
        observed_at=1_700_000_000.0 + i,
        count=1 + i % 3,
        message=f"NVRM: Xid (PCI:0000:3b:00): {i % 160}, pid={i}",
    )


SERVER_CHILD = Path(__file__).with_name("server_child.py")


def start_server(journal: Path, port: int) -> subprocess.Popen[str]:
    """The API in a child process (``server_child.py``); see :func:`wait_healthy`."""
    return subprocess.Popen(
        [sys.executable, str(SERVER_CHILD), str(journal), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Poll ``/healthz`` until it answers; fail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.communicate()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.02)  # not listening yet: poll again
    raise AssertionError(f"{url} never became healthy")
