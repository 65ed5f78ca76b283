"""One training process's progress as a small fixed-size record in a file, written through a
shared memory mapping so that reporting a step costs a few stores and no system call.

Layout (``RECORD_SIZE`` bytes, little-endian; :data:`_LAYOUT`)::

    magic "RPRG" | version u16 | flags u16 | seq u64       (seq is odd while a write is on)
    pid u32 | rank i32 | size i32 | phase u8 | pad
    step_started i64 | step_finished i64                   (-1: none yet)
    phase_since f64 | phase_budget_s f64 (0: the watcher's default for the phase)
    step_started_at f64 | step_finished_at f64 | last_step_s f64 | alive_at f64 (Unix s)
                                        (last_step_s: previous step's end to the last one's,
                                         less the announced phases between them)
    compute_total_s f64 | compute_steps i64     (the process's own share of the work, summed
                                         over the steps that reported it: waits for peers
                                         left out; a slow node shows here)
    node 64 bytes (UTF-8, NUL padded)

A reader copies the bytes and keeps them only when ``seq`` was even and unchanged around the
copy (a seqlock: the writer bumps it before and after each write). ``alive_at`` is refreshed
every second by a thread of the writer's own, so a process whose main thread is stuck still
looks alive, and one that is frozen whole (SIGSTOP, the freezer cgroup) does not.

The file lives as long as the process's run: a record left behind by a process that ended says
so (``phase`` is ``done`` after a clean end; otherwise its ``pid`` no longer runs, or runs on
another node).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from recovery.errors import UsageError, unknown_choice
from recovery.progress.registry import register

MAGIC = b"RPRG"
VERSION = 2
_LAYOUT = struct.Struct("<4sHHQIiiB7xqqdddddddq64s")
RECORD_SIZE = _LAYOUT.size
_SEQ = struct.Struct("<Q")
_SEQ_AT = 8
#: Seconds between the writer thread's ``alive_at`` refreshes.
ALIVE_EVERY_S = 1.0


class Phase(IntEnum):
    """What the loop says it is doing. ``steps`` is the loop itself; the others are phases
    that are legitimately long and get their own time budget from the watcher."""

    steps = 0
    startup = 1
    """Process start, joining, compiling (the first steps' compile too)."""
    restore = 2
    save = 3
    """A checkpoint save the loop waits for (a background save does not stop the loop)."""
    evaluation = 4
    data = 5
    """A data epoch boundary: reshuffling, reopening shards."""
    paused = 6
    """Deliberately idle between phases: never a stall."""
    done = 7
    """The process ended cleanly (completed or preempted after saving)."""


PHASES = {p.name: p for p in Phase}


def phase_named(name: str | Phase) -> Phase:
    """``name`` as a :class:`Phase`; UsageError naming the valid ones otherwise."""
    if isinstance(name, Phase):
        return name
    try:
        return PHASES[name]
    except KeyError:
        raise unknown_choice("phase", name, PHASES) from None


@dataclass(frozen=True)
class Record:
    """One process's progress as last written."""

    pid: int
    rank: int
    size: int
    node: str
    phase: Phase
    phase_since: float
    phase_budget_s: float
    """Seconds the loop allowed this phase when it entered it (0: the watcher's default)."""
    step_started: int
    """The step the loop entered last (-1: none yet)."""
    step_finished: int
    """The step whose update finished last (-1: none yet)."""
    step_started_at: float
    step_finished_at: float
    last_step_s: float
    """Time per step: from the step before's end to the last one's, less the announced
    phases in between (0: not known yet)."""
    alive_at: float
    """When the process's own thread last said it lives (every :data:`ALIVE_EVERY_S`)."""
    compute_total_s: float = 0.0
    """Seconds of the process's own work (no waiting for its peers), summed over
    :attr:`compute_steps` steps; a watcher takes the mean over a window by differences."""
    compute_steps: int = 0

    @property
    def in_step(self) -> bool:
        """True between entering a step and finishing it."""
        return self.step_started > self.step_finished


def record_path(directory: Path, rank: int) -> Path:
    """Process ``rank``'s progress file in ``directory``."""
    return directory / f"rank{rank}.progress"


@dataclass(slots=True)
class _Fields:
    """A writer's record before packing."""

    pid: int
    rank: int
    size: int
    phase: Phase = Phase.startup
    phase_since: float = 0.0
    phase_budget_s: float = 0.0
    step_started: int = -1
    step_finished: int = -1
    step_started_at: float = 0.0
    step_finished_at: float = 0.0
    last_step_s: float = 0.0
    alive_at: float = 0.0
    compute_total_s: float = 0.0
    compute_steps: int = 0


class ProgressWriter:
    """Writes one process's :class:`Record`. Not for several threads at once, except the
    writer's own ``alive_at`` thread (started by :meth:`start_alive`, stopped by
    :meth:`close`).

    ``registry``: a node-local directory where the node's agent finds this record
    (:mod:`recovery.progress.registry`; None: not registered), with the Slurm ``job``.

    Raises UsageError when the directory cannot hold the file.
    """

    def __init__(
        self,
        directory: Path,
        *,
        rank: int = 0,
        size: int = 1,
        node: str = "",
        clock: Callable[[], float] = time.time,
        registry: Path | None = None,
        job: str = "",
    ) -> None:
        self.path = record_path(directory, rank)
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Written whole beside it, then renamed into place: a reader never finds the file
        # empty or half made (the mapping follows the file across the rename).
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise UsageError(f"cannot write progress to {self.path}: {e}") from e
        try:
            os.ftruncate(fd, RECORD_SIZE)
            self._map = mmap.mmap(fd, RECORD_SIZE)
        finally:
            os.close(fd)
        now = clock()
        self._fields = _Fields(os.getpid(), rank, size, phase_since=now, alive_at=now)
        self._seq = 0
        self._buf = bytearray(RECORD_SIZE)
        self._in_phases = 0.0  # seconds in announced phases since the last finished step
        self._node = node.encode()[:64]
        with self._lock:
            self._write()
        try:
            os.replace(tmp, self.path)
        except OSError as e:
            self._map.close()
            raise UsageError(f"cannot write progress to {self.path}: {e}") from e
        self._entry = (
            None
            if registry is None
            else register(registry, self.path, node=node, job=job, pid=self._fields.pid)
        )

    # --- what the loop reports -----------------------------------------------------------------

    def step_started(self, step: int) -> None:
        with self._lock:
            f = self._fields
            f.step_started, f.step_started_at = step, self._clock()
            if f.phase is not Phase.steps:
                f.phase, f.phase_since = Phase.steps, f.step_started_at
                f.phase_budget_s = 0.0
            self._write()

    def step_finished(self, step: int, compute_s: float | None = None) -> None:
        """Step ``step``'s update finished. ``compute_s``: the seconds of it that were this
        process's own work, without waiting for its peers (a loop that can tell them apart:
        ``recover train`` with several processes), which lets a watcher find a slow node."""
        with self._lock:
            f = self._fields
            now = self._clock()
            if compute_s is not None and compute_s >= 0:
                f.compute_total_s += compute_s
                f.compute_steps += 1
            before = f.step_finished_at
            if before and f.step_finished == step - 1:
                f.last_step_s = max(0.0, now - before - self._in_phases)
            self._in_phases = 0.0
            if f.step_started != step:  # the loop reports only ends
                f.step_started, f.step_started_at = step, before or now
            f.step_finished, f.step_finished_at = step, now
            if f.phase is not Phase.steps:
                f.phase, f.phase_since, f.phase_budget_s = Phase.steps, now, 0.0
            self._write()

    def enter(self, phase: Phase | str, budget_s: float = 0.0) -> tuple[Phase, float, float]:
        """Enter ``phase`` (a :class:`Phase` or its name), allowed ``budget_s`` seconds (0: the
        watcher's default for it); returns what :meth:`restore` needs to go back to the phase
        before. UsageError for an unknown phase or a negative budget."""
        phase = phase_named(phase)
        if budget_s < 0:
            raise UsageError(f"a phase's budget must be >= 0 seconds (got {budget_s:g})")
        with self._lock:
            f = self._fields
            before = (f.phase, f.phase_since, f.phase_budget_s)
            f.phase, f.phase_since = phase, self._clock()
            f.phase_budget_s = float(budget_s)
            self._write()
        return before

    def restore(self, before: tuple[Phase, float, float]) -> None:
        """Leave a phase: back to the one before it, counted from now (a step loop that was
        interrupted by a save starts its clock again)."""
        with self._lock:
            f = self._fields
            now = self._clock()
            if before[0] is Phase.steps:  # not part of the time per step
                self._in_phases += now - f.phase_since
            f.phase, f.phase_since, f.phase_budget_s = before[0], now, before[2]
            self._write()

    @contextlib.contextmanager
    def phase(self, phase: Phase | str, budget_s: float = 0.0) -> Iterator[None]:
        """``with progress.phase("save"): ...``: the block is that phase (see :meth:`enter`)."""
        before = self.enter(phase, budget_s)
        try:
            yield
        finally:
            self.restore(before)

    # --- liveness ------------------------------------------------------------------------------

    def start_alive(self, every_s: float = ALIVE_EVERY_S) -> None:
        """Refresh ``alive_at`` every ``every_s`` from a daemon thread of this process."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._alive_loop, args=(every_s,), name="recover-progress", daemon=True
        )
        self._thread.start()

    def _alive_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.alive()

    def alive(self) -> None:
        """Say the process lives now (what the liveness thread does every second)."""
        with self._lock:
            if not self._map.closed:
                self._fields.alive_at = self._clock()
                self._write()

    def close(self, *, done: bool = True) -> None:
        """Stop the liveness thread; with ``done`` the record says the process ended cleanly."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * ALIVE_EVERY_S)
        if done and not self._map.closed:
            self.enter(Phase.done)
        with self._lock:
            if not self._map.closed:
                self._map.close()
        if self._entry is not None:
            self._entry.unlink(missing_ok=True)
            self._entry = None

    def _write(self) -> None:
        """Publish the fields (the caller holds the lock): seq odd, the record, seq even.
        The record is packed aside and copied in one piece: packing in place would zero the
        whole record first, and a reader could catch it empty."""
        f = self._fields
        if self._map.closed:
            return
        self._seq += 1
        _SEQ.pack_into(self._map, _SEQ_AT, self._seq)
        self._seq += 1
        _LAYOUT.pack_into(
            self._buf, 0, MAGIC, VERSION, 0, self._seq - 1, f.pid, f.rank, f.size,
            int(f.phase), f.step_started, f.step_finished, f.phase_since,
            f.phase_budget_s, f.step_started_at, f.step_finished_at,
            f.last_step_s, f.alive_at, f.compute_total_s, f.compute_steps, self._node,
        )  # fmt: skip
        self._map[:] = self._buf
        _SEQ.pack_into(self._map, _SEQ_AT, self._seq)


class RecordError(ValueError):
    """A progress file that is not (or not yet) a whole record."""


def parse(data: bytes) -> Record:
    """A :class:`Record` from ``data``; RecordError when it is not one (short, wrong magic or
    version, caught mid-write)."""
    if len(data) < RECORD_SIZE:
        raise RecordError(f"{len(data)} bytes, a record has {RECORD_SIZE}")
    (magic, version, _flags, seq, pid, rank, size, phase, started, finished, since, budget,
     started_at, finished_at, last_s, alive, compute_total, compute_steps,
     node) = _LAYOUT.unpack_from(data)  # fmt: skip
    if magic != MAGIC:
        raise RecordError(f"not a progress record (magic {magic!r})")
    if version != VERSION:
        raise RecordError(f"progress record version {version}; this reader knows {VERSION}")
    if seq % 2:
        raise RecordError("caught mid-write")
    try:
        named = Phase(phase)
    except ValueError:
        raise RecordError(f"unknown phase {phase}") from None
    return Record(
        pid=pid, rank=rank, size=size, node=node.rstrip(b"\0").decode(errors="replace"),
        phase=named, phase_since=since, phase_budget_s=budget, step_started=started,
        step_finished=finished, step_started_at=started_at, step_finished_at=finished_at,
        last_step_s=last_s, alive_at=alive, compute_total_s=compute_total,
        compute_steps=compute_steps,
    )  # fmt: skip


def read_record(path: Path, *, tries: int = 200) -> Record:
    """Read one progress file, retrying while the writer is mid-write (the record is copied
    out of a mapping between two reads of its sequence number).

    Raises OSError when it cannot be read, RecordError when it never held a whole record.
    """
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < RECORD_SIZE:
            raise RecordError(f"{path}: {size} bytes, a record has {RECORD_SIZE}")
        view = mmap.mmap(fh.fileno(), RECORD_SIZE, access=mmap.ACCESS_READ)
    try:
        last = "never read"
        for attempt in range(tries):
            before = _SEQ.unpack_from(view, _SEQ_AT)[0]
            data = view[:RECORD_SIZE]
            after = _SEQ.unpack_from(view, _SEQ_AT)[0]
            if before == after and not before % 2:
                try:
                    return parse(data)
                except RecordError as e:
                    if before:  # a whole record that is not one of ours
                        raise RecordError(f"{path}: {e}") from None
                    last = "not written yet"
            else:
                last = "changed while read"
            if attempt >= 10:
                time.sleep(0.0002)
        raise RecordError(f"{path}: {last}")
    finally:
        view.close()


def read_records(directory: Path) -> dict[int, Record]:
    """Every readable record in ``directory``, by rank. Files that are not records (yet) are
    skipped: a process that just created its file writes the record at once after."""
    out: dict[int, Record] = {}
    for path in sorted(directory.glob("rank*.progress")):
        try:
            record = read_record(path)
        except (OSError, RecordError):
            continue
        out[record.rank] = record
    return out
