"""NVIDIA's kernel messages -> faults: what one line of the driver's own text reports.

Recognised (the message must start with the driver's prefix, ``NVRM:`` or
``nvidia-nvswitchN:``; :mod:`agents.logform` peels whatever presentation wraps it). Each fault
names the rule that matched it (:data:`RULES`; ``recover agent parse`` shows it):

* ``xid``: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the
  bus.`` and every variant the driver has printed: no ``PCI:`` (``Xid (0000:03:00): 14,
  Channel ...``), any domain width (``PCI:0019:01:00``, ``PCI:00000000:3b:00``), a function
  digit, a MIG instance (``Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, ...``), ``pid``/``name``
  unknown (``'<unknown>'``, ``<unknown>``), absent, or ``pid`` alone. Fault ``xid<N>``, any N:
  whether the catalogue knows it is the coordinator's business. XID 154's new recovery action
  (``... changed from 0x0 (None) to 0x1 (...)``) becomes ``driver_action``.
* ``xid-cut``: an Xid line that breaks off right after its number, at the line's end or before
  anything but the comma the driver prints (``... 79`` , ``... 79 (``): the number ended, so
  it is the XID's. Letters or more digits run into the number make the line unreadable.
* ``sxid``: ``nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 24007, Fatal, Link 44 ...``: an
  NVSwitch error, its own fault family ``sxid<N>`` (never an XID; the bus id is the switch's).
  The driver says per occurrence whether it was fatal; a ``Non-fatal`` one carries
  ``driver_action: none``. The detail lines that follow a report (``Data {...}``, ``Severity 0
  Engine instance ...``) add nothing and give no fault.
* A GPU fallen off the bus or lost without an XID number, as ``xid79`` (the driver means the
  same thing; naming it so lets the agent and the coordinator fold it with an XID 79 line for
  the same GPU):

  - ``fell-off``: a line that says a GPU *has fallen off the bus*: ``NVRM: GPU
    0000:18:00.0: GPU has fallen off the bus.`` (osHandleGpuLost), ``NVRM: GPU at
    PCI:0000:af:00: GPU has fallen off the bus.``, older drivers' ``NVRM: GPU at 0000:01:00.0
    has fallen off the bus.``;
  - ``fell-off-split``: the message printed over up to three lines ``NVRM: The NVIDIA GPU
    0000:3b:00.0`` / ``NVRM: (PCI ID: 10de:2330) installed in this system has`` / ``NVRM:
    fallen off the bus and is not responding to commands.`` (also on one or two lines), joined
    into one fault by :class:`FellOffJoiner`;
  - ``gpu-lost``: a driver check that failed with the status ``NV_ERR_GPU_IS_LOST``, whose text
    is "GPU lost from the bus" (``NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the
    bus [NV_ERR_GPU_IS_LOST] (0x0000000F) ...``).

* ``init-failed``: the driver could not initialise the GPU: ``NVRM: GPU 0000:0a:00.0:
  RmInitAdapter failed! (0x24:0x72:1568)`` and its companion ``... rm_init_adapter failed,
  device minor number 5``, older drivers' ``NVRM: RmInitAdapter failed! (0x26:0xffff:1375)``,
  ``rm_init_adapter failed for device bearing minor number 0`` and ``rm_init_adapter(0)
  failed`` (no GPU named). Fault ``xid143``, the catalogue's GPU initialization failure. The
  detail lines before it (``RmInitAdapter: Cannot initialize GSP firmware RM``) give none.
* ``reset-required``: the driver's assertions that a GPU needs a reset (``...
  [NV_ERR_RESET_REQUIRED] (0x00000062) ...``) as ``gpu-reset-required``.

GSP RPC timeouts are XID 119 and 120 lines and come out as those XIDs. Everything else the
driver prints (loading banners, a GPU's UUID or serial number, persistence-mode notices, a
status by number only) is no fault; :func:`why_no_fault` says why for ``recover agent parse``.
Nothing here raises on odd input.
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
#: Fault code of a GPU the driver could not initialise (RmInitAdapter failed): the catalogue's
#: "GPU initialization failure", NVIDIA's XID 143, whose remedy (reset the GPU) is the same.
INIT_FAILED_FAULT = "xid143"
#: Every rule a driver message can match -> what it recognises (see the module docstring).
RULES: dict[str, str] = {
    "xid": "an 'NVRM: Xid (<bus>): <N>, ...' line",
    "xid-cut": "an 'NVRM: Xid (<bus>): <N>' line that breaks off after the number",
    "sxid": "an NVSwitch's 'nvidia-nvswitchN: SXid (<bus>): <N>, ...' report",
    "fell-off": "a driver line saying a GPU has fallen off the bus, without an XID number",
    "fell-off-split": "the driver's 'The NVIDIA GPU <bus> ... has fallen off the bus and is "
    "not responding to commands' message, its lines joined",
    "gpu-lost": "a driver check that failed with NV_ERR_GPU_IS_LOST (GPU lost from the bus)",
    "init-failed": "'RmInitAdapter failed' / 'rm_init_adapter failed': the driver could not "
    "initialise the GPU",
    "reset-required": "a driver check that failed with NV_ERR_RESET_REQUIRED",
}

_XID = re.compile(
    rf"^NVRM: Xid \((?P<bus>{BUS_ID})(?P<mig>(?: GPU-C?I:[0-9]+)*)\): (?P<xid>[0-9]{{1,6}})"
    r"(?P<after>.*)$",
    re.S,
)
_PID = re.compile(r"^pid=(?P<pid>'?<unknown>'?|'?[0-9]+'?),\s*")
_NAME = re.compile(r"^name=(?P<name>[^,]*),\s*")
_ACTION = re.compile(r"\bto 0x(?P<value>[0-9A-Fa-f]{1,8})\b")
_SXID = re.compile(
    rf"^nvidia-nvswitch(?P<switch>\d*): SXid \((?P<bus>{BUS_ID})\): (?P<code>\d{{1,6}})"
    r"(?:,\s*(?P<rest>.*)|\s*)$",
    re.S,
)
_SXID_SEVERITY = re.compile(r"^(?P<sev>Fatal|Non-?\s?fatal)\b,?\s*(?P<text>.*)$", re.I | re.S)
_SXID_DETAIL = re.compile(r"^(?:Data\b|Severity \d)")
_FELL_OFF = re.compile(r"\bhas fallen off the bus\b")
_GPU_PREFIX = re.compile(rf"^NVRM: GPU (?:at )?{BUS_ID}:\s+")
_GPU_LOST = re.compile(r"NV_ERR_GPU_IS_LOST|\bGPU lost from the bus\b")
_INIT_FAILED = re.compile(r"\bRmInitAdapter failed\b|\brm_init_adapter(?:\([0-9]+\))? failed\b")
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
    rule: str = ""


def match_message(message: str) -> DriverFault | None:
    """The fault one line of a driver's message reports, or None (a split fall-off-the-bus
    message is :class:`FellOffJoiner`'s business). An Xid line is read by the Xid grammar
    alone: one it cannot read gives nothing, whatever words it holds."""
    if message.startswith("NVRM: Xid "):
        return _xid(message)
    if message.startswith("nvidia-nvswitch"):
        return _sxid(message)
    if not message.startswith("NVRM: "):
        return None
    if _FELL_OFF.search(message) and _FELL_OFF_PHRASE not in message:
        return _numberless(FELL_OFF_FAULT, "fell-off", message)
    if _INIT_FAILED.search(message):
        return _numberless(INIT_FAILED_FAULT, "init-failed", message)
    return match_status(message)


def match_status(text: str) -> DriverFault | None:
    """The fault of a driver check that failed with a status naming one (``GPU lost from the
    bus [NV_ERR_GPU_IS_LOST]``, ``[NV_ERR_RESET_REQUIRED]``), or None. Also for a further line
    of a driver message: an assertion may be printed over two lines."""
    if _GPU_LOST.search(text):
        return _numberless(FELL_OFF_FAULT, "gpu-lost", text)
    if "NV_ERR_RESET_REQUIRED" in text:
        return reset_required(text)
    return None


def reset_required(message: str) -> DriverFault:
    """The fault of an assertion that names ``NV_ERR_RESET_REQUIRED`` (the bus id when the
    message happens to name a GPU)."""
    return _numberless(RESET_REQUIRED, "reset-required", message)


def _numberless(fault: str, rule: str, message: str) -> DriverFault:
    """A fault without a number: the GPU is the one the message names (``GPU <bus>``,
    ``GPU at <bus>``), if any; the text is the driver's words after its device prefix."""
    m = _ANY_GPU_BUS.search(message)
    prefix = _GPU_PREFIX.match(message)
    words = message[prefix.end() :] if prefix else message.replace("NVRM: ", "", 1)
    text = " ".join(words.split())
    return DriverFault(fault, _bus(m["bus"]) if m else None, text, message, rule=rule)


def why_no_fault(message: str) -> str:
    """Why a driver message gives no fault, in a few words (for ``recover agent parse``)."""
    if message.startswith("NVRM: Xid "):
        return "an Xid line without a readable bus id and number (cut short or garbled)"
    if message.startswith("nvidia-nvswitch"):
        return "an SXid detail line, or one without a readable bus id and code"
    if _GPU_START.match(message) or "installed in this system" in message:
        return "one line of a several-line driver message (its fault, if any, comes with its last)"
    return "no fault rule matches this driver message (informational)"


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
    after = m["after"]
    if after[:1].isalnum() or after[:1] == "_":
        return None  # letters or more digits run into the number: it cannot be trusted
    pid: int | None = None
    process: str | None = None
    rule = "xid"
    if not after.strip():
        rule, text = "xid-cut", "(the line ends after the XID number: it may have been cut short)"
    elif not after.lstrip().startswith(","):
        rule, text = "xid-cut", f"(the line breaks off after the XID number: {after.strip()!r})"
    else:
        rest = after.lstrip()[1:].lstrip()
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
    return DriverFault(f"xid{xid}", bus, text, message, xid, pid, process, action, rule)


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
    return DriverFault(
        f"sxid{int(m['code'])}", bus, text, message, driver_action=action, rule="sxid"
    )


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
        return DriverFault(FELL_OFF_FAULT, bus, words, "\n".join(lines), rule="fell-off-split")
