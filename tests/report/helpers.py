"""Helpers for the report tests: the sample run directories and their raw contents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parent / "samples"
NAMES = ("xid79-spare", "xid79-fallback", "xid79-empty-pool", "no-fault")


def copy_sample(name: str, into: Path) -> Path:
    """A writable copy of sample ``name`` under ``into``; returns the run directory."""
    target = into / name
    shutil.copytree(SAMPLES / name, target)
    return target


class Raw:
    """A sample's files as plain JSON, read without the code under test."""

    def __init__(self, directory: Path) -> None:
        self.run: dict[str, Any] = json.loads((directory / "run.json").read_text())
        self.incidents: list[dict[str, Any]] = json.loads(
            (directory / "incidents.json").read_text()
        )
        self.events: list[dict[str, Any]] = [
            json.loads(line) for line in (directory / "events.jsonl").read_text().splitlines()
        ]

    def phase(self, name: str, incident: int = 0) -> float:
        """Wall seconds of the incident's phase ``name`` (the first, if repeated)."""
        walls = [p["at"]["wall"] for p in self.incidents[incident]["phases"] if p["name"] == name]
        assert walls, f"no phase {name!r}"
        return float(min(walls))

    def events_of(self, kind: str, restart: int | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["event"] == kind and (restart is None or e.get("restart_count") == restart)
        ]

    def write(self, directory: Path) -> None:
        """Write these contents as a run directory (after a test changed them)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "run.json").write_text(json.dumps(self.run))
        (directory / "incidents.json").write_text(json.dumps(self.incidents))
        (directory / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events))
