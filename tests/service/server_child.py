"""Child process: the API over a journal, served until SIGTERM (then ``closed`` is printed) or
SIGKILL. Run from anywhere as ``python tests/service/server_child.py JOURNAL PORT``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tree under test

from recovery.ports.clock import SystemClock
from service.httpapi.app import create_app
from service.httpapi.server import serve
from service.journaldb.journal import SqliteJournal
from tests.service.helpers import FakeCoordinator, tokens


def main(path: str, port: int) -> None:
    clock = SystemClock()
    journal = SqliteJournal(Path(path), clock)
    app = create_app(journal=journal, tokens=tokens(), coordinator=FakeCoordinator(), clock=clock)
    serve(app, port=port, log_level="warning")
    journal.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
