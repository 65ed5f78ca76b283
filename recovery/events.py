"""The training job's event log: ``RUN_DIR/events.jsonl``, one JSON object per line.

``recover report`` joins these lines with the coordinator's journal, so the schema is part of
the product: every line has ``event`` (one of :data:`EVENTS`), ``ts`` (wall clock, Unix
seconds), ``step``, ``pid``, and, under Slurm, ``slurm_job_id`` and ``restart_count``.

A job of several processes writes one file per process (:func:`events_file`): process 0
``events.jsonl``, process ``r`` ``events.rank<r>.jsonl``; each of their lines also has
``rank`` and ``ranks`` (the process count). :func:`read_rank_events` reads them all.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from recovery.errors import unknown_choice

EVENTS = frozenset(
    {
        "started",  # process up, configuration known, before restore
        "restored",  # state loaded from a verified checkpoint
        "fallback",  # a newer checkpoint failed verification and was skipped
        "memory-fallback",  # no node-local copy could be used; the checkpoints are
        "warmup",  # compilation (and one discarded call) done
        "step",  # one optimizer update finished
        "checkpoint",  # a checkpoint became durable
        "preempted",  # stopped by SIGTERM/SIGUSR1 after saving
        "completed",  # reached the final step; carries state_digest
        "joined",  # the processes of a multi-process job formed their group
        "peer-lost",  # stopping at once because another process of the job was lost
    }
)

EVENTS_FILE = "events.jsonl"


def events_file(run_dir: Path, rank: int = 0) -> Path:
    """Process ``rank``'s event log in ``run_dir``: ``events.jsonl`` for process 0 (and for a
    single-process run), ``events.rank<r>.jsonl`` for the others."""
    return run_dir / (EVENTS_FILE if rank == 0 else f"events.rank{rank}.jsonl")


def event_files(run_dir: Path) -> dict[int, Path]:
    """The event logs in ``run_dir``, by rank (those that exist): :func:`events_file`'s names
    read back."""
    out: dict[int, Path] = {}
    main = run_dir / EVENTS_FILE
    if main.exists():
        out[0] = main
    for path in run_dir.glob("events.rank*.jsonl"):
        rank = path.name[len("events.rank") : -len(".jsonl")]
        if rank.isdigit() and int(rank) > 0:
            out[int(rank)] = path
    return dict(sorted(out.items()))


def read_rank_events(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Every process's events in ``run_dir``, by rank (only the files that exist)."""
    return {rank: list(read_events(path)) for rank, path in event_files(run_dir).items()}


def slurm_context(environ: Mapping[str, str]) -> dict[str, Any]:
    """Slurm identifiers worth recording, taken from a job's environment (empty outside Slurm).

    ``SLURM_RESTART_COUNT`` is unset on a job's first run and counts requeues afterwards.
    """
    if "SLURM_JOB_ID" not in environ:
        return {}
    ctx: dict[str, Any] = {
        "slurm_job_id": environ["SLURM_JOB_ID"],
        "restart_count": int(environ.get("SLURM_RESTART_COUNT", "0") or 0),
    }
    if "SLURMD_NODENAME" in environ:
        ctx["node"] = environ["SLURMD_NODENAME"]
    return ctx


class EventLog:
    """Appends events to a JSONL file; safe to call from several threads.

    Each line is written with a single ``write`` on an ``O_APPEND`` descriptor, so a killed
    process leaves whole lines behind (possibly minus the last one), never interleaved text.
    Lines are not fsynced: losing the last events on power loss is acceptable for a log.

    Args:
        path: the file (created if missing, appended to otherwise).
        context: fields added to every line (e.g. :func:`slurm_context`).
        clock: wall clock in seconds.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        context: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._context = dict(context or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return the record written (a dict).

        Raises:
            UsageError: ``event`` is not one of :data:`EVENTS` (the message lists them).
        """
        if event not in EVENTS:
            raise unknown_choice("event", event, EVENTS)
        record: dict[str, Any] = {"event": event, "ts": round(self._clock(), 6), "pid": os.getpid()}
        record.update(self._context)
        record.update(fields)
        line = (json.dumps(record, sort_keys=False) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
        return record

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_events(path: Path | str) -> Iterator[dict[str, Any]]:
    """The events of an events file in order, one dict per line, read lazily; a torn last
    line left by a killed writer is skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            yield json.loads(line)
