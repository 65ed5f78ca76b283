"""Follow the kernel log (``/dev/kmsg`` or a plain file) and turn new fault lines into events.

Where reading starts (``from_start``, ``resume``): by default at the start of this boot's log,
skipping what a previous run already reported (:class:`agents.readmark.Mark`), so a fault
logged before the agent started is reported once, and a restart reports nothing twice.
``/dev/kmsg`` holds the boot from its first record (unless the ring buffer has overwritten the
oldest), and its mark counts only in the boot it was made in. A plain file (a syslog file
such as ``kern.log``) may span several boots: its mark counts in any boot while the file is
the same one, and on a first read from its start the faults before the last boot banner
(``Linux version ...``) are earlier boots' history and are skipped (one log line says how
many). ``from_start=False`` starts at the end.

A plain file may be truncated (``copytruncate``) or replaced (rotation): both are noticed on
the next poll, and a replaced file is read to its end before the new one is opened.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from agents.faultline import XID_TEXT, append_fault_line, format_fault_line
from agents.kmsg import KernelFault, KernelLogParser, to_event
from agents.logform import read_line
from agents.readmark import Mark
from recovery.model import HealthEvent
from recovery.ports.clock import Clock

__all__ = [
    "DEV_KMSG",
    "XID_TEXT",
    "KmsgFollower",
    "append_fault_line",
    "format_fault_line",
]

DEV_KMSG = Path("/dev/kmsg")
#: Hands one event and the mark of its line to the agent.
Emit = Callable[[HealthEvent, Mark], None]
Log = Callable[[str], None]
#: Largest record /dev/kmsg hands out in one read (the kernel's limit is under 8 KiB).
KMSG_RECORD_MAX = 8192


@dataclass
class _Open:
    """The file being read: its stream, identity, the unfinished last line and the byte
    offset where that unfinished line starts."""

    stream: BinaryIO
    ino: int
    dev: int
    partial: bytes = b""
    offset: int = 0
    is_char_device: bool = False


#: One complete line and where reading stands after it (a record's seq or a file offset).
_Line = tuple[bytes, int]


@dataclass
class KmsgFollower:
    """Reads new kernel-log lines on each :meth:`poll` and returns their fault events.

    ``path`` is ``/dev/kmsg`` (records, one per read) or a plain file (lines). ``clock`` gives
    each event its ``observed_at`` (wall seconds). ``buses`` maps NVML bus ids to accelerator
    indices (:func:`agents.busid.bus_map`). ``resume`` is where a previous run of this boot
    stopped (see the module docstring). A missing file is waited for; it is read from its
    start when it appears. Not thread-safe: one thread polls.
    """

    node: str
    boot_id: str
    clock: Clock
    path: Path = DEV_KMSG
    buses: Mapping[str, int] | None = None
    from_start: bool = True
    log: Log = print
    agent_version: str = ""
    resume: Mark | None = None
    _cur: _Open | None = field(default=None, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)
    _parser: KernelLogParser = field(default_factory=KernelLogParser, init=False, repr=False)
    _first_record: bool = field(default=True, init=False, repr=False)
    _history: bool = field(default=False, init=False, repr=False)

    def poll(self) -> list[HealthEvent]:
        """Everything complete that was appended since the last poll, parsed into events.

        Raises OSError only for errors other than the file being absent.
        """
        return [event for event, _ in self.poll_marked()]

    def poll_marked(self) -> list[tuple[HealthEvent, Mark]]:
        """Like :meth:`poll`, each event with the mark of the line it came from."""
        lines: list[_Line] = []
        cur = self._cur
        if cur is None:
            cur = self._open(at_end=not self._started and not self.from_start)
            self._started = True
            if cur is None:
                return []
        elif not cur.is_char_device:
            cur = self._follow_rename_or_truncate(cur, lines)
        self._cur = cur
        lines.extend(self._read(cur))
        return self._events(lines, cur)

    def run(self, emit: Emit, stop: threading.Event, interval_s: float = 0.25) -> None:
        """Poll every ``interval_s`` seconds, handing each event and its mark to ``emit``,
        until ``stop``."""
        try:
            while not stop.is_set():
                for event, mark in self.poll_marked():
                    emit(event, mark)
                stop.wait(interval_s)
        finally:
            self.close()

    def close(self) -> None:
        """Close the file; a later poll reopens it (at its start)."""
        if self._cur is not None:
            self._cur.stream.close()
            self._cur = None

    # --- opening, rotation ----------------------------------------------------------------

    def _open(self, *, at_end: bool) -> _Open | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._started = True  # a file that appears later is new: read it whole
            return None
        char = stat.S_ISCHR(st.st_mode)
        if char:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            stream: BinaryIO = os.fdopen(fd, "rb", buffering=0)
        else:
            stream = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        cur = _Open(stream, st.st_ino, st.st_dev, is_char_device=char)
        if at_end:
            cur.offset = stream.seek(0, os.SEEK_END)
        elif not char:
            cur.offset = stream.seek(self._resume_offset(st))
            self._history = cur.offset == 0  # a first read: earlier boots may be in it
        return cur

    def _resume_offset(self, st: os.stat_result) -> int:
        """Where a previous run stopped in this very file, in any boot (0: its start)."""
        mark = self.resume
        if mark is None or mark.offset is None:
            return 0
        if (mark.dev, mark.ino) != (st.st_dev, st.st_ino) or mark.offset > st.st_size:
            return 0  # another file, or this one was truncated since
        return mark.offset

    def _follow_rename_or_truncate(self, cur: _Open, lines: list[_Line]) -> _Open:
        """The file to read next: ``cur``, rewound if truncated, or the file that replaced it
        (after appending the rest of ``cur`` to ``lines``)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return cur  # rotated away and not yet recreated: keep reading the old one
        if (st.st_ino, st.st_dev) != (cur.ino, cur.dev):
            self.resume = None  # the new file is read from its start
            new = self._open(at_end=False)
            if new is None:
                return cur  # vanished between stat and open; retry next poll
            lines.extend(self._read(cur, final=True))  # finish the rotated file first
            cur.stream.close()
            return new
        if st.st_size < cur.offset + len(cur.partial):
            self.log(f"kmsg: {self.path} was truncated; reading it again from the start")
            cur.stream.seek(0)
            cur.partial, cur.offset = b"", 0
        return cur

    # --- reading ---------------------------------------------------------------------------

    def _read(self, cur: _Open, *, final: bool = False) -> list[_Line]:
        if cur.is_char_device:
            return self._read_records(cur)
        data = cur.partial + cur.stream.read()
        *complete, cur.partial = data.split(b"\n")
        if final and cur.partial:
            complete.append(cur.partial)
            cur.partial = b""
        out = []
        for line in complete:
            cur.offset += len(line) + 1
            out.append((line, cur.offset))
        return out

    def _read_records(self, cur: _Open) -> list[_Line]:
        records: list[_Line] = []
        done = self.resume.seq if self.resume and self.resume.boot_id == self.boot_id else None
        while True:
            try:
                record = os.read(cur.stream.fileno(), KMSG_RECORD_MAX)
            except BlockingIOError:
                return records
            except OSError as e:
                if e.errno == errno.EPIPE:  # the ring buffer overwrote records we had not read
                    self.log("kmsg: kernel ring buffer overran; some records were lost")
                    continue
                raise
            if not record:
                return records
            line = record.split(b"\n", 1)[0]  # the rest holds " KEY=value" lines
            seq = _record_seq(line)
            self._say_if_wrapped(seq, done)
            if seq is not None and done is not None and seq <= done:
                continue  # a previous run of this boot already reported it
            records.append((line, seq if seq is not None else -1))

    def _say_if_wrapped(self, seq: int | None, done: int | None) -> None:
        if not self._first_record:
            return
        self._first_record = False
        if seq and self.from_start and (done is None or done + 1 < seq):
            self.log(
                f"kmsg: the kernel ring buffer no longer holds this boot's first {seq} "
                "record(s); a fault logged among them is not seen here (the journald source "
                "keeps the whole boot)"
            )

    def _events(self, lines: list[_Line], cur: _Open) -> list[tuple[HealthEvent, Mark]]:
        out: list[tuple[HealthEvent, Mark]] = []
        now = self.clock.now().wall
        earlier = 0  # faults of earlier boots skipped
        for raw, where in lines:
            text = raw.decode("utf-8", errors="replace")
            if self._history and _BANNER in raw and is_boot_banner(text):
                earlier += len(out)
                out.clear()  # what came before this boot's first line is history
            for fault in self._parser.feed(text):
                out.append((self._event(fault, now), self._mark(cur, where)))
        if self._history and earlier:
            self.log(
                f"kmsg: skipped {earlier} fault line(s) of earlier boots in {self.path} "
                "(before its last 'Linux version' line)"
            )
        self._history = False
        return out

    def _event(self, fault: KernelFault, now: float) -> HealthEvent:
        return to_event(
            fault,
            node=self.node,
            boot_id=self.boot_id,
            observed_at=now,
            buses=self.buses,
            agent_version=self.agent_version,
        )

    def _mark(self, cur: _Open, where: int) -> Mark:
        if cur.is_char_device:
            return Mark(self.boot_id, seq=where if where >= 0 else None)
        return Mark(self.boot_id, dev=cur.dev, ino=cur.ino, offset=where)


_BANNER = b"Linux version "


def is_boot_banner(line: str) -> bool:
    """True for the kernel's first line of a boot (``Linux version ...``), in any
    presentation."""
    record = read_line(line)
    return record.kernel and record.text.startswith("Linux version ")


def _record_seq(line: bytes) -> int | None:
    """The sequence number of a /dev/kmsg record (``PRIO,SEQ,USEC,FLAGS;...``)."""
    parts = line.split(b",", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
