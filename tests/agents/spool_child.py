"""Child process for the spool crash test: spool events forever, acknowledging some.

Run as ``python spool_child.py DIR FIRST``. It opens the spool (cleaning up what a killed
predecessor left), prints ``ready <n>`` with the number of events found, then puts events
``FIRST, FIRST+1, ...`` (ids from tests.agents.helpers.make_event), printing ``spooled <id>``
after each put returns; after every third put it acknowledges the oldest pending event,
printing ``acking <id>`` before and ``acked <id>`` after the call.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def say(*words: object) -> None:
    """One line to the parent in one write (print() under PYTHONUNBUFFERED writes each word
    on its own, and a kill between them leaves a line cut short)."""
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())


def main(directory: str, first: int) -> None:
    from agents.spool import Spool
    from tests.agents.helpers import make_event

    spool = Spool(Path(directory), max_events=1_000_000, max_bytes=1 << 40, log=lambda _: None)
    say("ready", len(spool))
    n = first
    while True:
        event = make_event(n, size=200 + n % 300)
        if not spool.put(event):
            sys.exit(f"put refused {event.id}")
        say("spooled", event.id)
        if n % 3 == 2:
            oldest = spool.pending(limit=1)[0].event.id
            say("acking", oldest)  # from here it may be gone after a kill
            spool.ack(oldest)
            say("acked", oldest)
        n += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
