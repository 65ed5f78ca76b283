"""Kernel-log lines -> health events: every presentation (:mod:`agents.logform`), every
driver message (:mod:`agents.nvmsg`), one stateful parser for a whole log.

:class:`KernelLogParser` reads a log line by line (or journal entry by entry) and keeps the
little state a log needs: the lines of one message that a presentation printed apart (a
``dmesg``/``journalctl`` continuation line, indented; the three lines of a GPU fallen off the
bus), and the fields of one ``-o export`` entry. :func:`parse_line` is the same for a single
line. Lines that only quote a kernel message (a traceback, a program's own log line, another
program's syslog line) are not kernel lines and give nothing.

Event ids are stable across re-reads and presentations: a line with the kernel's time stamp
is identified by that stamp (microseconds since boot) and its message, so the same kernel
line read from ``/dev/kmsg``, from journald or from a saved ``dmesg`` gets the same id; a
line without one by a digest of the whole line.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from agents.busid import bus_map, kernel_bus_id, nvml_bus_id
from agents.ids import event_id
from agents.logform import (
    Record,
    anchored,
    from_entry,
    is_kmsg_dict_line,
    json_entry,
    read_line,
)
from agents.nvmsg import FELL_OFF_FAULT, DriverFault, FellOffJoiner, match_message, match_status
from recovery.model import DriverAction, HealthEvent, Source

_FIELD = re.compile(r"^\s*(?P<key>_{0,2}[A-Z][A-Z0-9_]{0,63})=(?P<value>.*)$", re.S)

__all__ = [
    "FELL_OFF_FAULT",
    "KernelFault",
    "KernelLogParser",
    "bus_map",
    "kernel_bus_id",
    "kmsg_event_id",
    "nvml_bus_id",
    "parse_line",
    "parse_lines",
    "to_event",
]


class KernelFault(NamedTuple):
    """One fault, as the kernel wrote it.

    ``bus_id`` is in NVML's form (``00000000:3B:00.0``; None when the message names no
    device); ``xid`` is None for faults without an XID number; ``pid``/``process`` are None
    when the kernel did not know them; ``seq`` (the /dev/kmsg record) and ``kernel_ts``
    (seconds since boot) come from the presentation when it has them; ``message`` is the
    kernel's whole message (its lines joined by newlines), ``line`` the text it was read
    from, ``form`` the presentation (:attr:`agents.logform.Record.form`), ``rule`` the rule
    that matched it (:data:`agents.nvmsg.RULES`).
    """

    fault: str
    xid: int | None
    bus_id: str | None
    text: str
    pid: int | None = None
    process: str | None = None
    seq: int | None = None
    kernel_ts: float | None = None
    line: str = ""
    message: str = ""
    form: str = "plain"
    driver_action: DriverAction | None = None
    rule: str = ""


#: Text without which a line can report nothing (checked before any parsing: most kernel
#: lines are not the NVIDIA driver's, and a flood must cost little per line).
_KEYWORDS = (
    "NVRM",
    "nvidia-nvswitch",
    "fallen off the bus",
    "NV_ERR_RESET_REQUIRED",
    "NV_ERR_GPU_IS_LOST",
    "GPU lost from the bus",
)


@dataclass(slots=True)
class _Last:
    """The kernel line the next continuation line belongs to: parsed only when a
    continuation that matters comes (``record`` None until then)."""

    raw: str
    record: Record | None = None
    driver_block: bool = False


class KernelLogParser:
    """A whole log's faults, fed one line (:meth:`feed`) or journal entry (:meth:`feed_entry`)
    at a time, in order; :meth:`flush` at the end of the input. Never raises on odd input.
    Not thread-safe: one parser per log."""

    def __init__(self) -> None:
        self._last: _Last | None = None
        self._joiner = FellOffJoiner()
        self._export: dict[str, str] | None = None

    def feed(self, line: str) -> list[KernelFault]:
        """The faults completed by one more line of text (with or without its newline)."""
        raw = line.rstrip("\r\n")
        field = _export_field(raw)
        if field is not None:
            if self._export is None:
                self._export = {}
            self._export[field[0]] = field[1]
            return []
        out = self._end_export()
        entry = json_entry(raw) if raw.lstrip("\x1e").startswith("{") else None
        if entry is not None:
            return out + self.feed_entry(entry)
        if not raw.strip():
            self._last = None
            return out
        if raw[0].isspace():
            return out + self._continuation(raw)
        if not any(k in raw for k in _KEYWORDS):
            self._last = _Last(raw)  # nothing to report; remembered for a continuation
            return out
        return out + self._record(read_line(raw))

    def feed_entry(self, entry: Mapping[str, Any], form: str = "journal-json") -> list[KernelFault]:
        """The faults of one journal entry (``-o json`` object or ``-o export`` fields)."""
        record = from_entry(entry, form)
        if record is None:
            self._last = None
            return []
        return self._record(record)

    def flush(self) -> list[KernelFault]:
        """The faults still pending at the end of the input (an unfinished export entry)."""
        self._last = None
        return self._end_export()

    # --- internals -----------------------------------------------------------------------

    def _end_export(self) -> list[KernelFault]:
        entry, self._export = self._export, None
        return self.feed_entry(entry, "journal-export") if entry else []

    def _record(self, record: Record) -> list[KernelFault]:
        if not record.kernel:
            self._last = None
            return []
        lines = record.text.split("\n")
        block = anchored(lines[0])
        self._last = _Last(record.raw, record, block)
        return self._lines(record, [ln.strip() for ln in lines], block, record.raw)

    def _continuation(self, raw: str) -> list[KernelFault]:
        """An indented line: more of the last kernel message (dmesg and journalctl print a
        message's further lines so), unless it is a /dev/kmsg dictionary line."""
        last = self._last
        if last is None or is_kmsg_dict_line(raw) or not any(k in raw for k in _KEYWORDS):
            return []
        if last.record is None:
            record = read_line(last.raw)
            if not record.kernel:
                self._last = None
                return []
            last.record, last.driver_block = record, anchored(record.text)
        return self._lines(last.record, [raw.strip()], last.driver_block, raw)

    def _lines(
        self, record: Record, lines: list[str], driver_block: bool, raw: str
    ) -> list[KernelFault]:
        out: list[KernelFault] = []
        for text in lines:
            found = match_message(text) if anchored(text) else None
            if found is None and driver_block and not anchored(text):
                found = match_status(text)  # an assertion printed over two lines
            if found is not None:
                out.append(_fault(found, record, raw))
            joined = self._joiner.feed(text)
            if joined is not None:
                out.append(_fault(joined, record, raw))
        return out


def _export_field(raw: str) -> tuple[str, str] | None:
    """``(KEY, value)`` of a ``-o export`` or (indented) ``-o verbose`` field line, else None
    (a /dev/kmsg dictionary line is none)."""
    m = _FIELD.match(raw)
    if m is None or m["key"] in ("SUBSYSTEM", "DEVICE"):
        return None
    return m["key"], m["value"]


def _fault(found: DriverFault, record: Record, raw: str) -> KernelFault:
    return KernelFault(
        fault=found.fault,
        xid=found.xid,
        bus_id=found.bus,
        text=found.text,
        pid=found.pid,
        process=found.process,
        seq=record.seq,
        kernel_ts=record.kernel_ts,
        line=raw,
        message=found.message,
        form=record.form,
        driver_action=found.driver_action,
        rule=found.rule,
    )


def parse_line(line: str) -> KernelFault | None:
    """The first fault one line reports, or None (a continuation or part of a split
    message alone reports nothing). Never raises on odd input."""
    parser = KernelLogParser()
    found = parser.feed(line) + parser.flush()
    return found[0] if found else None


def kmsg_event_id(node: str, boot_id: str, fault: KernelFault) -> str:
    """The stable id of a fault line (see the module docstring).

    Two byte-identical lines without a kernel time stamp get the same id: nothing tells them
    apart, and the coordinator keeps one.
    """
    if fault.kernel_ts is not None:
        usec = round(fault.kernel_ts * 1e6)
        digest = hashlib.sha256(fault.message.encode()).hexdigest()
        return event_id(node, "kmsg", boot_id, "at", usec, digest, fault.fault)
    digest = hashlib.sha256(f"{fault.line}\n{fault.message}".encode()).hexdigest()
    return event_id(node, "kmsg", boot_id, "line", digest, fault.fault)


def to_event(
    fault: KernelFault,
    *,
    node: str,
    boot_id: str,
    observed_at: float,
    buses: Mapping[str, int] | None = None,
    agent_version: str = "",
) -> HealthEvent:
    """The health event for one parsed fault.

    ``observed_at`` is the wall clock (Unix seconds) when the agent read the line; ``buses``
    (from :func:`bus_map`) fills in the accelerator index where the bus id is known (never
    for an NVSwitch). Raises pydantic's ValidationError for an invalid node name.
    """
    if fault.xid is not None:
        label = f"XID {fault.xid}"
    elif fault.fault.startswith("sxid"):
        label = f"SXid {fault.fault[4:]}"
    elif fault.fault.startswith("xid"):
        label = "no XID number"  # a numberless wording given its XID's code (FELL_OFF_FAULT)
    else:
        label = fault.fault
    who = ""
    if fault.pid is not None or fault.process is not None:
        who = f" (pid {fault.pid if fault.pid is not None else '?'}, {fault.process or '?'})"
    where = fault.bus_id or "an unnamed GPU"
    gpu = None if fault.bus_id is None or fault.fault.startswith("sxid") else fault.bus_id
    return HealthEvent(
        id=kmsg_event_id(node, boot_id, fault),
        node=node,
        source=Source.kmsg,
        fault=fault.fault,
        accelerator=(buses or {}).get(gpu) if gpu else None,
        bus_id=fault.bus_id,
        observed_at=observed_at,
        message=f"{label} on {where}{who}: {fault.text}"[:2048],
        agent_version=agent_version,
        driver_action=fault.driver_action,
    )


def parse_lines(
    lines: Iterable[str],
    *,
    node: str,
    boot_id: str,
    observed_at: float,
    buses: Mapping[str, int] | None = None,
) -> list[HealthEvent]:
    """Every fault event in ``lines``, in order (no deduplication)."""
    parser = KernelLogParser()
    faults = [f for line in lines for f in parser.feed(line)] + parser.flush()
    return [
        to_event(f, node=node, boot_id=boot_id, observed_at=observed_at, buses=buses)
        for f in faults
    ]
