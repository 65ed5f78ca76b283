"""Child process for the journal crash tests: append events until killed.

Run from the repository root as ``python tests/service/journal_crash_child.py PATH START SEED``.
It opens the journal, prints ``ready``, then appends :func:`crash_event` ``START``,
``START+1``, ... in batches of 1-8 (sizes from ``SEED``), printing after each append returns
(the batch is durable then) one line ``acked <i>:<new|dup> ...``.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tree under test

from recovery.ports.clock import SystemClock
from service.journaldb.journal import SqliteJournal
from tests.service.helpers import crash_event


def say(*words: object) -> None:
    """One line to the parent in one write (print() under PYTHONUNBUFFERED writes each word
    on its own, and a kill between them leaves a line cut short)."""
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())


def main(path: str, start: int, seed: int) -> None:
    rng = random.Random(seed)
    clock = SystemClock()
    journal = SqliteJournal(Path(path), clock)
    say("ready")
    i = start
    while True:
        batch = [crash_event(n) for n in range(i, i + rng.randint(1, 8))]
        new = journal.append_events(batch, clock.now())
        words = [
            f"{n}:{'new' if f else 'dup'}"
            for n, f in zip(range(i, i + len(batch)), new, strict=True)
        ]
        say("acked", *words)
        i += len(batch)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
