"""NVIDIA's kernel messages -> faults: what one line of the driver's own text reports.

Recognised (the message must start with the driver's prefix, ``NVRM:`` or
``nvidia-nvswitchN:``; :mod:`agents.logform` peels whatever presentation wraps it):

* ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`` and
  every variant the driver has printed: no ``PCI:`` (``Xid (0000:03:00): 14, Channel ...``),
  a function digit, a MIG instance (``Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, ...``),
  ``pid``/``name`` unknown (``'<unknown>'``, ``<unknown>``), absent, or ``pid`` alone. A line
  cut short right after the number still yields the XID (the driver always prints more, so
  the event's text says the line ends there). Fault ``xid<N>``, any N: whether the catalogue
  knows it is the coordinator's business. XID 154's new recovery action
  (``... changed from 0x0 (None) to 0x1 (...)``) becomes ``driver_action``.
* ``nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 24007, Fatal, Link 44 ...``: an NVSwitch error,
  its own fault family ``sxid<N>`` (never an XID; the bus id is the switch's). The driver says
  per occurrence whether it was fatal; a ``Non-fatal`` one carries ``driver_action: none``.
  The detail lines that follow a report (``Data {...}``, ``Severity 0 Engine instance ...``)
  add nothing and give no fault.
* A GPU fallen off the bus without an XID number, as ``xid79`` (the driver means the same
  thing; naming it so lets the agent and the coordinator fold it with an XID 79 line for the
  same GPU): ``NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.``, ``NVRM: GPU at
  PCI:0000:af:00: GPU has fallen off the bus.``, and the message split over up to three lines
  ``NVRM: The NVIDIA GPU 0000:3b:00.0`` / ``NVRM: (PCI ID: 10de:2330) installed in this system
  has`` / ``NVRM: fallen off the bus and is not responding to commands.`` (also on one or two
  lines), joined into one fault by :class:`FellOffJoiner`.
* The driver's assertions that a GPU needs a reset (``... [NV_ERR_RESET_REQUIRED]
  (0x00000062) ...``) as ``gpu-reset-required``.

GSP RPC timeouts are XID 119 and 120 lines and come out as those XIDs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from agents.busid import BUS_ID, nvml_bus_id
from recovery.model import DriverAction

#: ``nvmlDeviceGetGpuRecoveryAction`` values (NVML_GPU_RECOVERY_ACTION_*), which XID 154's
#: text also prints, -> the schema's names. 6 (bus reset) is a stronger GPU reset; 7 (system
#: reboot) a node reboot; 5 (recover the IMEX domain) has no counterpart yet and is reported
#: with ``driver_action`` unset.
RECOVERY_ACTIONS: dict[int, DriverAction] = {
    0: DriverAction.none,
    1: DriverAction.gpu_reset,
    2: DriverAction.node_reboot,
    3: DriverAction.drain_p2p,
    4: DriverAction.drain_and_reset,
    6: DriverAction.gpu_reset,
    7: DriverAction.node_reboot,
}
#: Fault code of the driver's "a reset is required" assertions.
RESET_REQUIRED = "gpu-reset-required"
#: Fault code a GPU fallen off the bus gets when its line has no XID number.
FELL_OFF_FAULT = "xid79"

_XID = re.compile(
    rf"^NVRM: Xid \((?P<bus>{BUS_ID})(?P<mig>(?: GPU-C?I:\d+)*)\): (?P<xid>\d{{1,6}})"
    r"(?:,\s*(?P<rest>.*)|\s*)$",
    re.S,
)
_PID = re.compile(r"^pid=(?P<pid>'?<unknown>'?|'?\d+'?),\s*")
_NAME = re.compile(r"^name=(?P<name>[^,]*),\s*")
_ACTION = re.compile(r"\bto 0x(?P<value>[0-9A-Fa-f]{1,8})\b")
_SXID = re.compile(
    rf"^nvidia-nvswitch(?P<switch>\d*): SXid \((?P<bus>{BUS_ID})\): (?P<code>\d{{1,6}})"
    r"(?:,\s*(?P<rest>.*)|\s*)$",
    re.S,
)
_SXID_SEVERITY = re.compile(r"^(?P<sev>Fatal|Non-?\s?fatal)\b,?\s*(?P<text>.*)$", re.I | re.S)
_SXID_DETAIL = re.compile(r"^(?:Data\b|Severity \d)")
_FELL_OFF_LINE = re.compile(
    rf"^NVRM: GPU (?:at )?(?P<bus>{BUS_ID}):\s+(?P<text>.*\bfallen off the bus\b.*)$", re.S
)
_GPU_START = re.compile(rf"^NVRM: The NVIDIA GPU (?P<bus>{BUS_ID})\b")
_FELL_OFF_PHRASE = "fallen off the bus and is not responding to commands"
_ANY_GPU_BUS = re.compile(rf"\bGPU (?:at )?(?P<bus>{BUS_ID})\b")
#: Lines (of any kind) a split fall-off-the-bus message may take from its first line to its
#: last: the driver prints three; a line or two of another message may come between.
JOIN_WINDOW = 6


class DriverFault(NamedTuple):
    """What one driver message reports. ``bus`` is in NVML's form (None when the message
    names no device); ``text`` is the driver's words after the number and pid/name;
    ``message`` the whole kernel message (all of its lines, for a joined one)."""

    fault: str
    bus: str | None
    text: str
    message: str
    xid: int | None = None
    pid: int | None = None
    process: str | None = None
    driver_action: DriverAction | None = None


def match_message(message: str) -> DriverFault | None:
    """The fault one line of a driver's message reports, or None (a split fall-off-the-bus
    message is :class:`FellOffJoiner`'s business)."""
    if message.startswith("NVRM: Xid "):
        return _xid(message)
    if message.startswith("nvidia-nvswitch"):
        return _sxid(message)
    if not message.startswith("NVRM: "):
        return None
    m = _FELL_OFF_LINE.match(message)
    if m:
        return DriverFault(FELL_OFF_FAULT, _bus(m["bus"]), m["text"].strip(), message)
    if "NV_ERR_RESET_REQUIRED" in message:
        return reset_required(message)
    return None


def reset_required(message: str) -> DriverFault:
    """The fault of an assertion that names ``NV_ERR_RESET_REQUIRED`` (the bus id when the
    message happens to name a GPU)."""
    m = _ANY_GPU_BUS.search(message)
    text = " ".join(message.replace("NVRM: ", "", 1).split())
    return DriverFault(RESET_REQUIRED, _bus(m["bus"]) if m else None, text, message)


def _bus(text: str) -> str | None:
    try:
        return nvml_bus_id(text)
    except ValueError:
        return None


def _xid(message: str) -> DriverFault | None:
    m = _XID.match(message)
    if m is None:
        return None
    bus = _bus(m["bus"])
    if bus is None:
        return None
    xid = int(m["xid"])
    rest = m["rest"]
    pid: int | None = None
    process: str | None = None
    if rest is None:
        text = "(the line ends after the XID number: it may have been cut short)"
    else:
        pm = _PID.match(rest)
        if pm:
            digits = pm["pid"].strip("'")
            pid = int(digits) if digits.isdigit() else None
            rest = rest[pm.end() :]
        nm = _NAME.match(rest)
        if nm:
            name = nm["name"].strip().strip("'")
            process = None if name in ("<unknown>", "") else name
            rest = rest[nm.end() :]
        text = rest.strip()
    if m["mig"]:
        text = f"{text} [MIG{m['mig']}]".strip()
    action = None
    if xid == 154:
        am = _ACTION.search(text)
        action = RECOVERY_ACTIONS.get(int(am["value"], 16)) if am else None
    return DriverFault(f"xid{xid}", bus, text, message, xid, pid, process, action)


def _sxid(message: str) -> DriverFault | None:
    m = _SXID.match(message)
    if m is None:
        return None
    bus = _bus(m["bus"])
    rest = (m["rest"] or "").strip()
    if bus is None or _SXID_DETAIL.match(rest):
        return None
    switch = f"NVSwitch {m['switch'] or '?'}"
    sm = _SXID_SEVERITY.match(rest)
    action = None
    if sm and sm["sev"].lower() != "fatal":
        action = DriverAction.none  # the driver says this occurrence needs nothing done
    text = f"{switch}: {rest}" if rest else switch
    return DriverFault(f"sxid{int(m['code'])}", bus, text, message, driver_action=action)


@dataclass
class _Pending:
    bus: str | None
    lines: list[str] = field(default_factory=list)
    seen: int = 0


@dataclass
class FellOffJoiner:
    """Joins the fall-off-the-bus message the driver prints over up to three lines.

    Feed every line of driver text in order (:meth:`feed`); the line that completes the
    message returns one ``xid79`` fault for the GPU named by its first line. A completing
    line whose first line was never seen still gives the fault (the GPU unknown). Not
    thread-safe; one per log.
    """

    _pending: _Pending | None = None

    def feed(self, line: str) -> DriverFault | None:
        """The joined fault when ``line`` completes one, else None."""
        start = _GPU_START.match(line)
        if start is not None:
            self._pending = _Pending(_bus(start["bus"]), [line])
            return self._complete_if(line)
        pending = self._pending
        if pending is None:
            if line.startswith("NVRM: ") and _FELL_OFF_PHRASE in line:
                return self._fault(None, [line])
            return None
        pending.seen += 1
        if line.startswith("NVRM: "):
            pending.lines.append(line)
            done = self._complete_if(line)
            if done is not None:
                return done
        if pending.seen >= JOIN_WINDOW:
            self._pending = None
        return None

    def _complete_if(self, line: str) -> DriverFault | None:
        pending = self._pending
        if pending is None or _FELL_OFF_PHRASE not in line:
            return None
        self._pending = None
        return self._fault(pending.bus, pending.lines)

    @staticmethod
    def _fault(bus: str | None, lines: list[str]) -> DriverFault:
        words = " ".join(" ".join(ln.replace("NVRM: ", "", 1).split()) for ln in lines)
        return DriverFault(FELL_OFF_FAULT, bus, words, "\n".join(lines))
