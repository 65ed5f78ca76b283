"""Helpers of the coordinator's real-daemon tests: a handle on a coordinator process, the
scontrol shim that logs its Slurm updates, and training runs' events and control digests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery import proc, statedir
from recovery.model import HealthEvent, Source
from service.daemons import coordinator as coordinator_proc
from service.httpapi.client import Client, admin_token
from tests.helpers import RECOVER_SCRIPT

SHIM = """#!/bin/sh
echo "$*" >> "{log}"
exec "{real}" "$@"
"""


@dataclass
class Coordinator:
    """A running coordinator: where it listens, its state dir, its scontrol log."""

    state_dir: Path
    conf: Path
    env: dict[str, str]
    log: Path
    endpoint: statedir.Endpoint | None = None
    config: Path | None = None
    """The policy file it serves with (None: the defaults)."""
    journal_dsn: str | None = None
    """Its journal in this PostgreSQL database (None: the state dir's SQLite file)."""
    _seq: list[int] = field(default_factory=lambda: [0])

    def start(self) -> None:
        extra = ["--journal-dsn", self.journal_dsn] if self.journal_dsn else []
        self.endpoint = coordinator_proc.start(
            self.state_dir, slurm_conf=self.conf, env=self.env, config=self.config,
            extra_args=extra,
        )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the coordinator process (no shutdown of any kind)."""
        assert self.endpoint is not None
        os.kill(self.endpoint.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while proc.alive(self.endpoint.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not proc.alive(self.endpoint.pid)

    @property
    def client(self) -> Client:
        assert self.endpoint is not None
        return Client(self.endpoint.url, admin_token(self.state_dir / statedir.TOKENS_FILE))

    def send(self, node: str, fault: str) -> str:
        """Report ``fault`` on ``node`` as an agent would (admin token); returns the event id."""
        (event_id,) = self.send_together([node], fault)
        return event_id

    def send_together(self, nodes: list[str], fault: str) -> list[str]:
        """Report ``fault`` on each of ``nodes`` in one request (one commit, so the engine
        decides them in one step against one view of the cluster); returns the event ids."""
        events = []
        for node in nodes:
            self._seq[0] += 1
            events.append(
                HealthEvent(
                    id=f"test-{os.getpid()}-{self._seq[0]}-{time.monotonic_ns()}",
                    node=node,
                    source=Source.injected,
                    fault=fault,
                    observed_at=time.time(),
                    injected=True,
                ).model_dump(mode="json")
            )
        answer = self.client.post("/v1/events", {"events": events})
        assert answer["accepted"] == [e["id"] for e in events]
        return list(answer["accepted"])

    def incidents(self) -> list[dict[str, Any]]:
        return list(self.client.get("/v1/incidents"))

    def incident_on(self, node: str) -> dict[str, Any] | None:
        found = [i for i in self.incidents() if i["node"] == node]
        return found[-1] if found else None

    def scontrol_changes(self) -> list[str]:
        """Every ``scontrol`` call that changes something (updates, requeues), in order."""
        if not self.log.exists():
            return []
        return [ln for ln in self.log.read_text().splitlines() if not ln.startswith("show")]

    def scontrol_updates(self) -> list[str]:
        """Every ``scontrol update ...`` the coordinator ran, in order."""
        if not self.log.exists():
            return []
        return [ln for ln in self.log.read_text().splitlines() if ln.startswith("update")]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a ``recover`` operator verb against this coordinator."""
        return subprocess.run(
            [RECOVER_SCRIPT, *args, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def phases(incident: dict[str, Any]) -> list[str]:
    """An incident's phase names in time order."""
    return [p["name"] for p in sorted(incident["phases"], key=lambda p: p["at"]["wall"])]


_CONTROL: dict[tuple[str, ...], str] = {}


def control_digest(run_dir: Path, args: list[str]) -> str:
    """Final state digest of the same training run, undisturbed and outside Slurm; computed
    once per configuration per session."""
    key = tuple(args)
    if key not in _CONTROL:
        done = subprocess.run(
            [RECOVER_SCRIPT, "train", "--run-dir", str(run_dir), *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        (completed,) = [e for e in events(run_dir) if e["event"] == "completed"]
        _CONTROL[key] = str(completed["state_digest"])
    return _CONTROL[key]


def events(run_dir: Path) -> list[dict[str, Any]]:
    """The training run's events.jsonl, parsed (empty before it exists)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
