"""Kernel-log lines -> health events: a pure parser of NVIDIA's ``NVRM:`` fault lines.

Accepted line shapes (the prefix is stripped, then the kernel message itself is matched):

* a raw ``/dev/kmsg`` record: ``priority,seq,timestamp_us,flags;message``;
* a ``dmesg`` line: ``[12345.678901] message`` (also ``dmesg -T``'s ``[Tue Dec  1 ...] message``);
* a syslog/journal line whose tag is ``kernel:`` (``Dec  1 07:49:49 host kernel: message``);
* a plain ``message``.

The message must *start* with ``NVRM:``. A line that merely quotes an XID (a traceback, an
application's log ``myapp: saw NVRM: Xid ...``, a syslog line tagged by another program) is not
a kernel fault and is ignored.

Recognised messages:

* ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``
  (also ``pid='<unknown>', name=<unknown>``, no pid/name at all, and the old form without
  ``PCI:``: ``NVRM: Xid (0000:03:00): 14, Channel 00000001``) -> fault ``xid<N>``;
* ``NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.`` -> fault ``xid79``. The driver prints
  this line for the same condition as XID 79 (often next to an ``Xid ... 79`` line); naming it
  ``xid79`` rather than ``gpu-lost`` lets deduplication fold the pair into one fault and gives
  it the catalogue's XID 79 action (reboot the machine). ``gpu-lost`` stays NVML's name for a
  handle that answers ``NVML_ERROR_GPU_IS_LOST``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agents.ids import event_id
from recovery.model import HealthEvent, Source

_KMSG_RECORD = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<ts>\d+),(?P<flags>[^;]*);(?P<msg>.*)$")
_DMESG = re.compile(r"^\[\s*(?P<ts>\d+\.\d+)\]\s?(?P<msg>.*)$")
_DMESG_HUMAN = re.compile(r"^\[[A-Z][a-z]{2} [^\]]*\d{4}\]\s?(?P<msg>.*)$")
_SYSLOG_KERNEL = re.compile(
    r"^(?:[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+)\s+\S+\s+kernel:\s"
    r"(?:\[\s*(?P<ts>\d+\.\d+)\]\s?)?(?P<msg>.*)$"
)

_BUS = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_XID = re.compile(
    rf"^NVRM: Xid \((?:PCI:)?(?P<bus>{_BUS})\): (?P<xid>\d{{1,5}})(?:,\s*(?P<rest>.*?))?\s*$"
)
_PID_NAME = re.compile(
    r"^pid=(?P<pid>'<unknown>'|<unknown>|\d+), name=(?P<name>[^,]*),\s*(?P<text>.*)$"
)
_FELL_OFF = re.compile(
    rf"^NVRM: GPU (?:at )?(?:PCI:)?(?P<bus>{_BUS}): (?P<text>GPU has fallen off the bus\.?.*)$"
)

#: Fault code for the fall-off-the-bus line that carries no XID number (see module docstring).
FELL_OFF_FAULT = "xid79"


@dataclass(frozen=True)
class KernelFault:
    """One fault line, as the kernel wrote it.

    ``bus_id`` is normalised to NVML's form (``00000000:3B:00.0``); ``xid`` is None for the
    numberless fall-off-the-bus line; ``pid``/``process`` are None when the kernel did not know
    them; ``seq``/``kernel_ts`` (seconds since boot) come from the line's prefix when present.
    """

    fault: str
    xid: int | None
    bus_id: str
    text: str
    pid: int | None = None
    process: str | None = None
    seq: int | None = None
    kernel_ts: float | None = None
    line: str = ""


def nvml_bus_id(bus: str) -> str:
    """A PCI bus id in NVML's form: 8-digit upper-case domain and a function digit.

    ``0000:3b:00`` (the kernel's, no function) -> ``00000000:3B:00.0``;
    ``00000000:3B:00.0`` stays as it is. Raises ValueError on anything else.
    """
    m = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.([0-7]))?", bus)
    if m is None:
        raise ValueError(f"not a PCI bus id: {bus!r} (like 0000:3b:00 or 00000000:3B:00.0)")
    domain, bus_no, device, function = m.groups()
    return f"{int(domain, 16):08X}:{bus_no.upper()}:{device.upper()}.{function or '0'}"


def kernel_bus_id(bus: str) -> str:
    """The kernel log's short form of a bus id: ``00000000:3B:00.0`` -> ``0000:3b:00``."""
    domain, bus_no, rest = nvml_bus_id(bus).split(":")
    return f"{int(domain, 16):04x}:{bus_no.lower()}:{rest.split('.')[0].lower()}"


def bus_map(devices: Iterable[tuple[int, str]]) -> dict[str, int]:
    """``{nvml bus id: accelerator index}`` from NVML's device list ``(index, busId)``.

    Lookups with :func:`nvml_bus_id` of a kernel bus id then find the index. A device whose
    function digit is not 0 is also found by its kernel form, which drops the function.
    """
    out: dict[str, int] = {}
    for index, bus in devices:
        full = nvml_bus_id(bus)
        out[full] = index
        out.setdefault(full.rsplit(".", 1)[0] + ".0", index)
    return out


def _strip_prefix(line: str) -> tuple[str, int | None, float | None]:
    """(kernel message, kmsg seq, seconds since boot) with any known prefix removed."""
    m = _KMSG_RECORD.match(line)
    if m:
        return m["msg"], int(m["seq"]), int(m["ts"]) / 1e6
    m = _DMESG.match(line)
    if m:
        return m["msg"], None, float(m["ts"])
    m = _DMESG_HUMAN.match(line)
    if m:
        return m["msg"], None, None
    m = _SYSLOG_KERNEL.match(line)
    if m:
        return m["msg"], None, float(m["ts"]) if m["ts"] else None
    return line, None, None


def parse_line(line: str) -> KernelFault | None:
    """The fault a kernel-log line reports, or None when it reports none.

    Never raises on odd input: an unparseable line is simply not a fault.
    """
    raw = line.rstrip("\r\n")
    if not raw or raw[0].isspace():  # /dev/kmsg continuation lines (" SUBSYSTEM=pci") and blanks
        return None
    msg, seq, ts = _strip_prefix(raw)
    m = _XID.match(msg)
    if m:
        xid = int(m["xid"])
        rest = m["rest"] or ""
        pid: int | None = None
        process: str | None = None
        text = rest
        pm = _PID_NAME.match(rest)
        if pm:
            pid = int(pm["pid"]) if pm["pid"].isdigit() else None
            name = pm["name"].strip()
            process = None if name in ("<unknown>", "'<unknown>'", "") else name
            text = pm["text"]
        return KernelFault(
            f"xid{xid}", xid, nvml_bus_id(m["bus"]), text, pid, process, seq, ts, raw
        )
    m = _FELL_OFF.match(msg)
    if m:
        bus = nvml_bus_id(m["bus"])
        return KernelFault(FELL_OFF_FAULT, None, bus, m["text"], None, None, seq, ts, raw)
    return None


def kmsg_event_id(node: str, boot_id: str, fault: KernelFault) -> str:
    """The stable id of a fault line: by /dev/kmsg sequence number when the line has one
    (unique within a boot), else by a digest of the line itself.

    Two byte-identical lines without a sequence number (no timestamp either) get the same id:
    nothing tells them apart, and the coordinator keeps one.
    """
    if fault.seq is not None:
        return event_id(node, "kmsg", boot_id, "seq", fault.seq)
    digest = hashlib.sha256(fault.line.encode()).hexdigest()
    return event_id(node, "kmsg", boot_id, "line", digest)


def to_event(
    fault: KernelFault,
    *,
    node: str,
    boot_id: str,
    observed_at: float,
    buses: Mapping[str, int] | None = None,
    agent_version: str = "",
) -> HealthEvent:
    """The health event for one parsed fault line.

    ``observed_at`` is the wall clock (Unix seconds) when the agent read the line; ``buses``
    (from :func:`bus_map`) fills in the accelerator index where the bus id is known.
    Raises pydantic's ValidationError for an invalid node name.
    """
    label = f"XID {fault.xid}" if fault.xid is not None else "no XID number"
    who = ""
    if fault.pid is not None or fault.process is not None:
        who = f" (pid {fault.pid if fault.pid is not None else '?'}, {fault.process or '?'})"
    return HealthEvent(
        id=kmsg_event_id(node, boot_id, fault),
        node=node,
        source=Source.kmsg,
        fault=fault.fault,
        accelerator=(buses or {}).get(fault.bus_id),
        bus_id=fault.bus_id,
        observed_at=observed_at,
        message=f"{label} on {fault.bus_id}{who}: {fault.text}"[:2048],
        agent_version=agent_version,
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
    events = []
    for line in lines:
        fault = parse_line(line)
        if fault is not None:
            events.append(
                to_event(fault, node=node, boot_id=boot_id, observed_at=observed_at, buses=buses)
            )
    return events
