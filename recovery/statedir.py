"""The coordinator's state dir: the files in it, and where a serving coordinator listens.

Layout (created on first start by ``recover coordinator serve``)::

    STATE_DIR/journal.sqlite     the incident journal (SQLite, WAL)
    STATE_DIR/tokens             bearer tokens: one admin, one per node (mode 0600)
    STATE_DIR/coordinator.json   where it listens and its pid, while it runs
    STATE_DIR/coordinator.log    its log when started in the background

The start-up writes these, the local supervision and the API client read them; the names live
here, below all three, so that none of them imports another for a file name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from recovery.fsutil import atomic_write, read_json

#: Written by a serving coordinator into its state dir.
ENDPOINT_FILE = "coordinator.json"
TOKENS_FILE = "tokens"
JOURNAL_FILE = "journal.sqlite"
LOG_FILE = "coordinator.log"


@dataclass(frozen=True)
class Endpoint:
    """Where a coordinator listens and which process serves it."""

    url: str
    pid: int
    state_dir: Path

    @property
    def tokens_path(self) -> Path:
        return self.state_dir / TOKENS_FILE


def write_endpoint(state_dir: Path, url: str, pid: int) -> None:
    """Record where this coordinator listens (atomically, so readers never see half)."""
    atomic_write(state_dir / ENDPOINT_FILE, (json.dumps({"url": url, "pid": pid}) + "\n").encode())


def read_endpoint(state_dir: Path) -> Endpoint | None:
    """The endpoint a coordinator recorded in ``state_dir``, or None when none did. Raises
    RecoverError naming the file when it is unreadable or damaged."""
    return read_json(
        state_dir / ENDPOINT_FILE, lambda raw: Endpoint(str(raw["url"]), int(raw["pid"]), state_dir)
    )
