"""Writing a genuine-looking kernel line for a fault: fault injection through the kernel log
(``recover inject --via kmsg``, scenarios, benchmarks), read back by the agent's own parser.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agents.busid import kernel_bus_id, nvml_bus_id
from agents.nvmsg import RESET_REQUIRED
from recovery.ports.clock import Clock

#: What the driver prints after the XID number, for the faults injection uses most.
XID_TEXT: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted",
    43: "Ch 00000008",
    45: "Ch 00000008",
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
KINDS = "xid<N>, sxid<N>, gpu-lost or gpu-reset-required"


def format_fault_line(
    fault: str,
    bus_id: str,
    *,
    pid: int | None = None,
    process: str | None = None,
    note: str = "",
) -> str:
    """The kernel message the driver would print for ``fault`` on ``bus_id`` (either form),
    without a time stamp: ``xid<N>``, ``sxid<N>`` (a fatal NVSwitch error; ``bus_id`` is the
    switch's), ``gpu-lost`` (the numberless fall-off-the-bus line) or
    ``gpu-reset-required``. ``note`` (e.g. an injection marker) is appended as `` [note]``;
    the parser keeps it in the event's message. Raises ValueError for another fault code or
    a malformed bus id."""
    bus = kernel_bus_id(bus_id)
    tail = f" [{note}]" if note else ""
    if fault == "gpu-lost":
        return f"NVRM: GPU {bus}.0: GPU has fallen off the bus.{tail}"
    if fault == RESET_REQUIRED:
        return (
            f"NVRM: GPU {bus}.0: nvAssertOkFailedNoLog: Assertion failed: Reset required "
            f"[NV_ERR_RESET_REQUIRED] (0x00000062){tail}"
        )
    if fault.startswith("sxid") and fault[4:].isdigit():
        switch = nvml_bus_id(bus_id)[4:].lower()
        return f"nvidia-nvswitch0: SXid (PCI:{switch}): {int(fault[4:]):05d}, Fatal, Link 00{tail}"
    if not (fault.startswith("xid") and fault[3:].isdigit()):
        raise ValueError(f"cannot write a kernel line for fault {fault!r}; use {KINDS}")
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
    dmesg-style time stamp from ``clock`` (monotonic seconds), so two injections differ and
    get different event ids. The write is one ``write(2)`` call on an ``O_APPEND`` descriptor,
    so a concurrent reader never sees half a line. Raises OSError, ValueError (bad fault or
    bus id).
    """
    message = format_fault_line(fault, bus_id, pid=pid, process=process, note=note)
    is_char = path.exists() and stat.S_ISCHR(os.stat(path).st_mode)
    # /dev/kmsg: the newline ends the record. Without it the kernel keeps the record open for
    # a continuation, and readers see it only when the next record comes (measured: ~forever
    # on a quiet node; 10-40 us with it).
    line = f"<4>{message}\n" if is_char else f"[{clock.now().mono:12.6f}] {message}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return line
