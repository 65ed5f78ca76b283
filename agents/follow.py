"""Tail the kernel log (``/dev/kmsg`` or a plain file) and turn new fault lines into events;
and write a genuine-looking ``NVRM:`` line for a fault (fault injection through the kernel log).

The follower starts at the end by default (faults already in the log were the previous agent's
business; their ids are stable, so a re-read from the start is harmless too). A plain file may
be truncated (``copytruncate``) or replaced (rotation): both are noticed on the next poll, and a
replaced file is read to its end before the new one is opened.
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

from agents.kmsg import KernelFault, kernel_bus_id, parse_line, to_event
from recovery.model import HealthEvent
from recovery.ports.clock import Clock

DEV_KMSG = Path("/dev/kmsg")
Emit = Callable[[HealthEvent], None]
Log = Callable[[str], None]
#: Largest record /dev/kmsg hands out in one read (the kernel's limit is under 8 KiB).
KMSG_RECORD_MAX = 8192


@dataclass
class _Open:
    """The file being read: its descriptor/stream, identity, and the unfinished last line."""

    stream: BinaryIO
    ino: int
    dev: int
    partial: bytes = b""
    is_char_device: bool = False


@dataclass
class KmsgFollower:
    """Reads new kernel-log lines on each :meth:`poll` and returns their fault events.

    ``path`` is ``/dev/kmsg`` (records, one per read) or a plain file (lines). ``clock`` gives
    each event its ``observed_at`` (wall seconds). ``buses`` maps NVML bus ids to accelerator
    indices (:func:`agents.kmsg.bus_map`). A missing file is waited for; it is read from its
    start when it appears. Not thread-safe: one thread polls.
    """

    node: str
    boot_id: str
    clock: Clock
    path: Path = DEV_KMSG
    buses: Mapping[str, int] | None = None
    from_start: bool = False
    log: Log = print
    agent_version: str = ""
    skip_before: float | None = None
    """Ignore fault lines whose kernel timestamp (seconds since boot) is earlier than this:
    what was logged before this node's first agent started is history, not news. Lines
    without a timestamp are never skipped."""
    _cur: _Open | None = field(default=None, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)

    def poll(self) -> list[HealthEvent]:
        """Everything complete that was appended since the last poll, parsed into events.

        Raises OSError only for errors other than the file being absent.
        """
        lines: list[bytes] = []
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
        return self._events(lines)

    def run(self, emit: Emit, stop: threading.Event, interval_s: float = 0.25) -> None:
        """Poll every ``interval_s`` seconds, handing each event to ``emit``, until ``stop``."""
        try:
            while not stop.is_set():
                for event in self.poll():
                    emit(event)
                stop.wait(interval_s)
        finally:
            self.close()

    def close(self) -> None:
        """Close the file; a later poll reopens it (at its start)."""
        if self._cur is not None:
            self._cur.stream.close()
            self._cur = None

    # --- internals -----------------------------------------------------------------------

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
        if at_end:
            stream.seek(0, os.SEEK_END)
        return _Open(stream, st.st_ino, st.st_dev, is_char_device=char)

    def _follow_rename_or_truncate(self, cur: _Open, lines: list[bytes]) -> _Open:
        """The file to read next: ``cur``, rewound if truncated, or the file that replaced it
        (after appending the rest of ``cur`` to ``lines``)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return cur  # rotated away and not yet recreated: keep reading the old one
        if (st.st_ino, st.st_dev) != (cur.ino, cur.dev):
            new = self._open(at_end=False)
            if new is None:
                return cur  # vanished between stat and open; retry next poll
            lines.extend(self._read(cur, final=True))  # finish the rotated file first
            cur.stream.close()
            return new
        if st.st_size < cur.stream.tell():
            self.log(f"kmsg: {self.path} was truncated; reading it again from the start")
            cur.stream.seek(0)
            cur.partial = b""
        return cur

    def _read(self, cur: _Open, *, final: bool = False) -> list[bytes]:
        if cur.is_char_device:
            return self._read_records(cur)
        data = cur.partial + cur.stream.read()
        *complete, cur.partial = data.split(b"\n")
        if final and cur.partial:
            complete.append(cur.partial)
            cur.partial = b""
        return complete

    def _read_records(self, cur: _Open) -> list[bytes]:
        records: list[bytes] = []
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
            records.append(record.split(b"\n", 1)[0])  # the rest holds " KEY=value" lines

    def _events(self, lines: list[bytes]) -> list[HealthEvent]:
        events = []
        now = self.clock.now().wall
        for raw in lines:
            fault = parse_line(raw.decode("utf-8", errors="replace"))
            if fault is not None and not self._is_history(fault):
                events.append(
                    to_event(
                        fault,
                        node=self.node,
                        boot_id=self.boot_id,
                        observed_at=now,
                        buses=self.buses,
                        agent_version=self.agent_version,
                    )
                )
        return events

    def _is_history(self, fault: KernelFault) -> bool:
        ts, limit = fault.kernel_ts, self.skip_before
        return ts is not None and limit is not None and ts < limit


# --- writing fault lines (injection) ---------------------------------------------------------

#: What the driver prints after the XID number, for the faults injection uses most.
XID_TEXT: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    63: "Row Remapping: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapping: Failed to remap row, reset gpu.",
    74: "NVLink: fatal error detected on link 0",
    79: "GPU has fallen off the bus.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}


def format_fault_line(
    fault: str,
    bus_id: str,
    *,
    pid: int | None = None,
    process: str | None = None,
    note: str = "",
) -> str:
    """The kernel message the driver would print for ``fault`` (``xid<N>`` or ``gpu-lost``) on
    ``bus_id`` (either form), without a timestamp. ``note`` (e.g. an injection marker) is
    appended as `` [note]``; the parser keeps it in the event's message. Raises ValueError for
    another fault code."""
    bus = kernel_bus_id(bus_id)
    tail = f" [{note}]" if note else ""
    if fault == "gpu-lost":
        domain, rest = bus.split(":", 1)
        return f"NVRM: GPU {domain}:{rest}.0: GPU has fallen off the bus.{tail}"
    if not (fault.startswith("xid") and fault[3:].isdigit()):
        raise ValueError(f"cannot write a kernel line for fault {fault!r}; use xid<N> or gpu-lost")
    xid = int(fault[3:])
    who = f"pid={pid}" if pid is not None else "pid='<unknown>'"
    name = process or "<unknown>"
    text = XID_TEXT.get(xid, "Unspecified error (injected)")
    return f"NVRM: Xid (PCI:{bus}): {xid}, {who}, name={name}, {text}{tail}"


def append_fault_line(
    path: Path,
    fault: str,
    bus_id: str,
    *,
    clock: Clock,
    pid: int | None = None,
    process: str | None = None,
    note: str = "",
) -> str:
    """Append a fault line to ``path`` and return what was written.

    For ``/dev/kmsg`` (a character device) the message becomes one kernel record at warning
    level (needs root); for a plain file (a simulated node's kernel log) the line gets a
    dmesg-style timestamp from ``clock`` (monotonic seconds), so two injections differ and get
    different event ids. The write is one ``write(2)`` call on an ``O_APPEND`` descriptor, so
    a concurrent reader never sees half a line. Raises OSError, ValueError (bad fault/bus id).
    """
    message = format_fault_line(fault, bus_id, pid=pid, process=process, note=note)
    is_char = path.exists() and stat.S_ISCHR(os.stat(path).st_mode)
    line = f"<4>{message}" if is_char else f"[{clock.now().mono:12.6f}] {message}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return line
