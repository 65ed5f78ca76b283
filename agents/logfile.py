"""A saved kernel log -> the events the agent would report for it (``recover agent parse``).

Any presentation, even mixed in one file (:mod:`agents.logform`): dmesg in any of its forms,
syslog or journalctl text, /dev/kmsg records, ``journalctl -o json``/``json-seq``/``json-pretty``
and ``-o export`` (binary fields included). Each event says which rule matched its line and
the fields read from it (:data:`agents.nvmsg.RULES`); lines that mention the driver but give
no fault are listed too, each with the reason, so a reader sees at once what the agent would
*not* act on and why.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agents.dedup import Deduplicator
from agents.kmsg import KernelFault, KernelLogParser, to_event
from agents.logform import (
    anchored,
    from_entry,
    iter_export_entries,
    iter_json_entries,
    json_entry,
    looks_like_export,
    read_line,
)
from agents.nvmsg import RULES, why_no_fault
from recovery.errors import UsageError
from recovery.model import HealthEvent
from recovery.ports.clock import Stamp

#: Text that suggests a line is about the NVIDIA driver (for the "gave nothing" list).
_MENTIONS = re.compile(r"NVRM|\bS?Xid\b|nvidia-nvswitch|fallen off the bus", re.I)
#: Lines listed as "mentions the driver, gives no fault" at most.
SHOW_SILENT = 10


@dataclass
class _LineClock:
    """Time as the log tells it: mono = the kernel time stamp of the line being replayed."""

    wall: float
    mono: float = 0.0

    def now(self) -> Stamp:
        return Stamp(self.wall, self.mono)


@dataclass(frozen=True)
class Found:
    """One event, the number of the line (or journal entry) that completed it, its form, and
    why it was reported (the rule that matched and the fields read; "" for a summary)."""

    number: int
    event: HealthEvent
    form: str
    why: str = ""


def _units(data: bytes) -> tuple[str, Iterator[tuple[int, str | Mapping[str, Any]]]]:
    """What the file holds, and its lines or journal entries, numbered from 1."""
    if looks_like_export(data):
        return "journal entries", enumerate(iter_export_entries(data), start=1)
    text = data.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{\n") or text.lstrip().startswith("[\n"):  # -o json-pretty
        return "journal entries", enumerate(iter_json_entries(text), start=1)
    return "line(s)", enumerate(text.splitlines(), start=1)


def parse_file(
    path: Path,
    node: str,
    as_json: bool,
    *,
    boot_id: str = "saved-log",
    observed_at: float = 0.0,
    buses: dict[str, int] | None = None,
    window_s: float = 0.0,
) -> str:
    """The events the kernel-log source would emit for the log at ``path``, as text (one line
    per event with its line number and presentation, the lines that mention the driver but
    give nothing, then a summary) or as a JSON array of events.

    ``observed_at`` (Unix seconds) stamps every event; ``window_s`` > 0 folds repeats as the
    agent's deduplicator would, timed by the lines' kernel time stamps. Raises UsageError for
    a missing or unreadable file or an invalid node name.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read kernel log {path}: {e.strerror or e}") from e
    clock = _LineClock(observed_at)
    dedup = Deduplicator(clock, window_s) if window_s > 0 else None
    parser = KernelLogParser()
    found: list[Found] = []
    silent: list[tuple[int, str, str]] = []
    what, units = _units(data)
    count = 0
    rules: dict[tuple[str, str | None], str] = {}  # (fault, bus) -> why, for summaries

    def take(number: int, faults: list[KernelFault]) -> None:
        for fault in faults:
            event = _event(fault, node, boot_id, observed_at, buses)
            why = rules[(fault.fault, fault.bus_id)] = _why(fault)
            if dedup is None:
                found.append(Found(number, event, fault.form, why))
                continue
            clock.mono = max(clock.mono, fault.kernel_ts or clock.mono)
            found.extend(
                Found(number, e, fault.form, rules.get((e.fault, e.bus_id), ""))
                for e in dedup.offer(event)
            )

    for number, unit in units:
        count = number
        if isinstance(unit, str):
            faults = parser.feed(unit)
            shown = _shown(unit)
        else:
            faults = parser.feed_entry(unit, "journal-export")
            shown = _shown_entry(unit)
        if not faults and shown and _MENTIONS.search(shown):
            silent.append((number, shown, _why_silent(unit)))
        take(number, faults)
    take(count, parser.flush())
    if dedup is not None:
        found += [Found(count, e, "-", rules.get((e.fault, e.bus_id), "")) for e in dedup.drain()]
    if as_json:
        return json.dumps([f.event.model_dump(mode="json") for f in found], indent=2)
    return _render(path, count, what, found, silent)


def _why(fault: KernelFault) -> str:
    """The rule that matched a fault and the fields read from its line, in one phrase."""
    fields = [f"bus={fault.bus_id or '-'}"]
    if fault.xid is not None:
        fields.append(f"xid={fault.xid}")
    if fault.pid is not None:
        fields.append(f"pid={fault.pid}")
    if fault.process:
        fields.append(f"process={fault.process}")
    if fault.driver_action is not None:
        fields.append(f"driver_action={fault.driver_action.value}")
    about = RULES.get(fault.rule, "")
    return f"rule {fault.rule or '?'} ({about}): {' '.join(fields)}"


def _why_silent(unit: str | Mapping[str, Any]) -> str:
    """Why a line (or journal entry) that mentions the driver gives no fault."""
    if isinstance(unit, str):
        entry = json_entry(unit)
        record = read_line(unit) if entry is None else from_entry(entry, "journal-json")
    else:
        record = from_entry(unit, "journal-export")
    if record is None:
        return "a journal entry of another transport or program, not the kernel's"
    if not record.kernel:
        return "not a kernel line: another program's text that quotes the driver"
    text = next((ln.strip() for ln in record.text.split("\n") if anchored(ln.strip())), None)
    if text is None:
        return "a kernel line, but not the driver's own message (it quotes or resembles one)"
    return why_no_fault(text)


def _shown(line: str) -> str:
    """How a line is shown in the "reports no fault" list ("" for a continuation line)."""
    if line[:1].isspace():
        return ""
    entry = json_entry(line)
    return _shown_entry(entry) if entry is not None else line.strip()


def _shown_entry(entry: Mapping[str, Any]) -> str:
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(
            errors="replace"
        )
    who = f"{entry.get('_TRANSPORT', '?')} {entry.get('SYSLOG_IDENTIFIER', '?')}"
    return f"[journal: {who}] {message}" if isinstance(message, str) else ""


def _event(
    fault: KernelFault,
    node: str,
    boot_id: str,
    observed_at: float,
    buses: dict[str, int] | None,
) -> HealthEvent:
    try:
        return to_event(fault, node=node, boot_id=boot_id, observed_at=observed_at, buses=buses)
    except ValidationError as e:
        raise UsageError(f"invalid node name {node!r}: use letters, digits, '.-_'") from e


def _render(
    path: Path, count: int, what: str, found: list[Found], silent: list[tuple[int, str, str]]
) -> str:
    out = []
    for f in found:
        e = f.event
        gpu = f"gpu {e.accelerator}" if e.accelerator is not None else "gpu ?"
        folded = f" x{e.count}" if e.count > 1 else ""
        action = f" (driver: {e.driver_action})" if e.driver_action else ""
        why = f"  <- {f.why}" if f.why else ""
        out.append(
            f"line {f.number}: {e.fault}{folded} {gpu} {e.bus_id or '-'}{action}: {e.message}"
            f"{why}  [{f.form}]"
        )
    if silent:
        out.append(f"{len(silent)} line(s) mention the driver but report no fault:")
    for number, line, reason in silent[:SHOW_SILENT]:
        out.append(f"  line {number}: {line.strip()[:160]}  <- no fault: {reason}")
    if len(silent) > SHOW_SILENT:
        out.append(f"  ... and {len(silent) - SHOW_SILENT} more")
    faults = sorted({f.event.fault for f in found})
    forms = Counter(f.form for f in found)
    summary = f"{path}: {len(found)} event(s) from {count} {what}"
    if faults:
        summary += f"; faults: {', '.join(faults)}; forms: " + ", ".join(
            f"{form} ({n})" for form, n in sorted(forms.items())
        )
    else:
        summary += "; no fault lines"
    out.append(summary)
    return "\n".join(out)
