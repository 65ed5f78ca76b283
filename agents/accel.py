"""What the agent says of its node's accelerators in every heartbeat (``accelerators``): the
facts the coordinator's node check judges (docs/runbook.md, "Validating nodes").

``{"source": "nvml", "devices": 8, "lost": [3], "remap_failed": [], "retirement_pending": [],
"faults": 1, "last_fault": "xid79", "last_fault_at": 1796650000.2}``

``source`` is where the device count comes from: ``nvml``, ``tpu``, ``simulated`` (a local
node's ``--simulated-gpus``) or ``none`` (``devices`` null). ``faults`` counts the accelerator
faults the agent reported since it started, whichever source saw them (NVML, the kernel log,
the TPU runtime, an injection), and ``last_fault_at`` is when the newest was observed: a check
fails a node with a fault since its previous check.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recovery.model import HealthEvent, Source

#: Sources whose events are about accelerators (the progress source's are about jobs).
_ACCELERATOR_SOURCES = frozenset({Source.nvml, Source.kmsg, Source.tpu, Source.injected})
#: Fault codes of the injected and kernel-log kinds that are not about an accelerator.
_NOT_ACCELERATOR = ("rank-", "job-", "node-", "heartbeat-")


def is_accelerator_fault(event: HealthEvent) -> bool:
    """``event`` reports an accelerator fault (an XID, an NVSwitch SXid, a lost GPU, a TPU
    runtime error...), not a job's progress or a node's reachability."""
    return event.source in _ACCELERATOR_SOURCES and not event.fault.startswith(_NOT_ACCELERATOR)


class AcceleratorSummary:
    """The node's accelerators as last seen, thread-safe: the sources and the pipeline write,
    the heartbeat reads."""

    def __init__(self, source: str = "none", devices: int | None = None) -> None:
        self._lock = threading.Lock()
        self._source = source
        self._devices = devices
        self._flags: Callable[[], Mapping[str, Sequence[int]]] | None = None
        self._faults = 0
        self._last_fault = ""
        self._last_fault_at: float | None = None

    def devices_from(
        self, source: str, devices: int, flags: Callable[[], Mapping[str, Sequence[int]]] | None
    ) -> None:
        """A source (NVML, the TPU runtime) counted ``devices``; ``flags`` reads, when asked,
        the indices lost, with a failed row remap, or with a retirement pending."""
        with self._lock:
            self._source, self._devices, self._flags = source, devices, flags

    def saw(self, event: HealthEvent) -> None:
        """The pipeline got ``event``: count it if it is an accelerator fault."""
        if not is_accelerator_fault(event):
            return
        with self._lock:
            self._faults += 1
            if self._last_fault_at is None or event.observed_at >= self._last_fault_at:
                self._last_fault, self._last_fault_at = event.fault, event.observed_at

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            flags = self._flags() if self._flags is not None else {}
            return {
                "source": self._source,
                "devices": self._devices,
                "lost": sorted(flags.get("lost", ())),
                "remap_failed": sorted(flags.get("remap_failed", ())),
                "retirement_pending": sorted(flags.get("retirement_pending", ())),
                "faults": self._faults,
                "last_fault": self._last_fault,
                "last_fault_at": self._last_fault_at,
            }
