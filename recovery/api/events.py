"""The training job's event log, for user training loops: ``RUN_DIR/events.jsonl``.

The same log ``recover train`` writes and ``recover report`` reads (:mod:`recovery.events`);
``docs/library.md`` lists the events and the fields the report needs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from recovery.events import EVENTS, EventLog, read_events, slurm_context

__all__ = ["EVENTS", "EVENTS_FILE", "EventLog", "open_event_log", "read_events"]

#: The event log's name inside a run directory.
EVENTS_FILE = "events.jsonl"


def open_event_log(
    run_dir: Path | str,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> EventLog:
    """Open (append to) ``run_dir/events.jsonl``, adding the Slurm job id, restart count and
    node from ``environ`` (default: this process's environment) to every line.

    Close it with :meth:`EventLog.close` (or use it as a ``with`` block's resource via
    ``contextlib.closing``).
    """
    env = os.environ if environ is None else environ
    return EventLog(Path(run_dir) / EVENTS_FILE, context=slurm_context(env), clock=clock)
