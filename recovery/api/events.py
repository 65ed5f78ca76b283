"""The training job's event log, for user training loops: ``RUN_DIR/events.jsonl``.

The same log ``recover train`` writes and ``recover report`` reads (:mod:`recovery.events`);
``docs/library.md`` lists the events and the fields the report needs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from recovery.events import EVENTS, EventLog, events_file, read_events, slurm_context
from recovery.multiproc import topology_from_env

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

    In a job of several processes (see :func:`recovery.api.topology_from_env`) process ``r``
    other than 0 writes ``events.rank<r>.jsonl`` instead, and every line carries ``rank``
    and ``ranks``: the files ``recover report`` reads for K processes.

    Close it with :meth:`EventLog.close` (or use it as a ``with`` block's resource via
    ``contextlib.closing``).
    """
    env = os.environ if environ is None else environ
    topo = topology_from_env(env)
    context = slurm_context(env)
    if topo.multi:
        context = {**context, "rank": topo.rank, "ranks": topo.size}
    return EventLog(events_file(Path(run_dir), topo.rank), context=context, clock=clock)
