"""PCI bus ids of GPUs and NVSwitches, in every spelling the driver, NVML and people use.

The kernel log writes ``0000:3b:00`` (4-digit domain, no function) or ``0000:3b:00.0``; NVML
writes ``00000000:3B:00.0`` (8-digit domain, upper case, function) and, as its legacy form,
``0000:3B:00.0``; ``lspci`` and people write ``3b:00.0`` or ``3b:00`` (no domain). Every one
of them names the same device, and :func:`nvml_bus_id` turns each into NVML's form, which is
the one events carry and bus maps are keyed by.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

#: A bus id as it may appear inside a line: optional ``PCI:``, optional domain (1-8 hex
#: digits), bus and device (2 hex digits each), optional ``.function`` (0-7).
BUS_ID = r"(?:PCI:)?(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"

_PARTS = re.compile(
    r"(?:PCI:)?(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{2}):"
    r"(?P<device>[0-9A-Fa-f]{2})(?:\.(?P<function>[0-7]))?"
)


@lru_cache(maxsize=1024)  # a node has a handful of devices; its log repeats them
def nvml_bus_id(bus: str) -> str:
    """A PCI bus id in NVML's form: 8-digit upper-case domain and a function digit.

    ``0000:3b:00`` (the kernel's) and ``3b:00.0`` (no domain: domain 0) become
    ``00000000:3B:00.0``; NVML's own form stays as it is. Raises ValueError on anything else.
    """
    m = _PARTS.fullmatch(bus.strip())
    if m is None:
        raise ValueError(
            f"not a PCI bus id: {bus!r} (like 0000:3b:00, 0000:3b:00.0, 3b:00.0 or "
            "00000000:3B:00.0)"
        )
    domain = int(m["domain"] or "0", 16)
    return f"{domain:08X}:{m['bus'].upper()}:{m['device'].upper()}.{m['function'] or '0'}"


def kernel_bus_id(bus: str) -> str:
    """The kernel log's short form of a bus id: ``00000000:3B:00.0`` -> ``0000:3b:00``."""
    domain, bus_no, rest = nvml_bus_id(bus).split(":")
    return f"{int(domain, 16):04x}:{bus_no.lower()}:{rest.split('.')[0].lower()}"


def bus_map(devices: Iterable[tuple[int, str]]) -> dict[str, int]:
    """``{nvml bus id: accelerator index}`` from a device list ``(index, bus id)`` in any form.

    Lookups with :func:`nvml_bus_id` of a kernel bus id then find the index. A device whose
    function digit is not 0 is also found by its kernel form, which drops the function.
    Raises ValueError for a malformed bus id.
    """
    out: dict[str, int] = {}
    for index, bus in devices:
        full = nvml_bus_id(bus)
        out[full] = index
        out.setdefault(full.rsplit(".", 1)[0] + ".0", index)
    return out
