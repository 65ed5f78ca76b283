"""NVIDIA health through NVML (``nvidia-ml-py``, import name ``pynvml``).

Two kinds of signal:

* pushed: XID critical errors, from an NVML event set (``nvmlEventSetWait_v2`` with a timeout,
  so the source notices its stop event) -> fault ``xid<N>``;
* polled every ``poll_interval_s``: a device whose handle or queries answer
  ``NVML_ERROR_GPU_IS_LOST``/``NVML_ERROR_RESET_REQUIRED`` -> ``gpu-lost``; a rise of the
  volatile uncorrected ECC count -> ``ecc-uncorrected``; a remapped-row failure ->
  ``row-remap-failure``; a change of the driver's recovery action to one that asks for
  something -> ``xid154`` with ``driver_action``; clocks held back by the hardware (the
  clock event reasons: thermal or power slowdown, :data:`SLOWDOWN_REASONS`) on
  :data:`SLOWDOWN_POLLS` polls in a row -> ``gpu-slowdown``, once per episode: the evidence
  behind a slow node (the agents' straggler rule reports the cost, ``node-slow``).

Without a driver (``nvmlInit`` fails: library not found, driver not loaded, ...) the source
logs ONE line saying NVML is unavailable and why, and returns, so the agent's other sources
keep running. The module is passed in (``nvml``), so tests hand in a stand-in at exactly the
pynvml boundary.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.accel import AcceleratorSummary
from agents.busid import nvml_bus_id
from agents.ids import event_id
from agents.nvmsg import RECOVERY_ACTIONS
from recovery.model import HealthEvent, Source
from recovery.ports.clock import Clock

Emit = Callable[[HealthEvent], None]
Log = Callable[[str], None]

#: NVML error codes that mean the device is gone until reset (GPU_IS_LOST, RESET_REQUIRED).
LOST_CODES = (15, 16)
NOT_SUPPORTED = 3
TIMEOUT = 10
#: NVML's clock event (throttle) reasons that slow a GPU down against its will, by bit. The
#: rest (idle, application clocks, sync boost, display clock) are settings, and the software
#: power cap is how a GPU at full load normally runs: named in the message, never a slowdown.
SLOWDOWN_REASONS = {
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}
SW_POWER_CAP = 0x4
#: Polls in a row the clocks must be held back before it is reported (a moment's is not).
SLOWDOWN_POLLS = 3


def load_pynvml(log: Log = print) -> Any | None:
    """The ``pynvml`` module, or None (with one line logged) when nvidia-ml-py is missing."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        log(f"nvml: NVML is unavailable (nvidia-ml-py is not installed: {e}); source stopped")
        return None


@dataclass
class _Device:
    index: int
    handle: Any = None
    bus_id: str | None = None
    lost: bool = False
    ecc: int = 0
    ecc_supported: bool = True
    remap_failed: bool = False
    remap_pending: bool = False
    """A row remap waits for a GPU reset to take effect."""
    retirement_pending: bool = False
    """A page retirement waits for a driver reload (GPUs before row remapping)."""
    retirement_supported: bool = True
    remap_supported: bool = True
    action: int = 0
    action_supported: bool = True
    clocks_supported: bool = True
    slowed_polls: int = 0
    """Polls in a row the clocks were held back (0: not now)."""


@dataclass
class NvmlSource:
    """Watches every NVIDIA device on this node through ``nvml`` (the pynvml module).

    ``clock`` supplies ``observed_at`` (wall) and poll timing (mono). Use :meth:`run` in a
    thread; :meth:`start`, :meth:`wait_once` and :meth:`poll_once` are its steps.
    """

    node: str
    boot_id: str
    clock: Clock
    nvml: Any
    log: Log = print
    poll_interval_s: float = 10.0
    wait_ms: int = 1000
    agent_version: str = ""
    summary: AcceleratorSummary | None = None
    """Told the device count and, when asked, which devices are lost or need a reset (the
    heartbeat's ``accelerators``)."""
    devices: list[_Device] = field(default_factory=list, init=False)
    _events: Any = field(default=None, init=False, repr=False)
    _xid_seen: int = field(default=0, init=False, repr=False)

    def run(self, emit: Emit, stop: threading.Event) -> None:
        """Watch until ``stop`` is set; returns at once (one line logged) without NVML."""
        pending = self.start()
        if pending is None:
            return
        try:
            for event in pending:
                emit(event)
            next_poll = self.clock.now().mono
            while not stop.is_set():
                if self.clock.now().mono >= next_poll:
                    for event in self.poll_once():
                        emit(event)
                    next_poll = self.clock.now().mono + self.poll_interval_s
                if self._events is None:
                    stop.wait(min(self.poll_interval_s, self.wait_ms / 1000))
                    continue
                for event in self.wait_once():
                    emit(event)
        finally:
            self.close()

    def start(self) -> list[HealthEvent] | None:
        """Initialise NVML, list devices, register for XID events. None when NVML is
        unavailable (logged); else the events found on the way (devices already lost)."""
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as e:
            self.log(
                f"nvml: NVML is unavailable ({e}): no usable NVIDIA driver on this node; "
                "the NVML source stops, the other sources keep running"
            )
            return None
        count = self.nvml.nvmlDeviceGetCount()
        self.devices = [_Device(i) for i in range(count)]
        found: list[HealthEvent] = []
        for dev in self.devices:
            try:
                dev.handle = self.nvml.nvmlDeviceGetHandleByIndex(dev.index)
                dev.bus_id = _bus_id(self.nvml.nvmlDeviceGetPciInfo(dev.handle))
            except self.nvml.NVMLError as e:
                found += self._lost_or_log(dev, e, "opening")
        self._register(found)
        if self.summary is not None:
            self.summary.devices_from("nvml", count, self.flags)
        self.log(f"nvml: watching {count} device(s); XID events {self._xid_state()}")
        return found

    def wait_once(self) -> list[HealthEvent]:
        """Wait up to ``wait_ms`` for one XID event; [] on timeout."""
        try:
            data = self.nvml.nvmlEventSetWait_v2(self._events, self.wait_ms)
        except self.nvml.NVMLError as e:
            if e.value == TIMEOUT:
                return []
            self.log(f"nvml: waiting for events failed ({e}); polling only from now on")
            self._free_events()
            return []
        xid = int(data.eventData)
        dev = self._device_of(data.device)
        self._xid_seen += 1
        return [
            self._event(
                dev,
                f"xid{xid}",
                f"NVML XID {xid} critical error event",
                key=("xid", xid, self._xid_seen, round(self.clock.now().mono * 1e9)),
            )
        ]

    def poll_once(self) -> list[HealthEvent]:
        """Check every device once: lost, ECC, remapped rows, driver recovery action."""
        out: list[HealthEvent] = []
        for dev in self.devices:
            if dev.lost:
                continue
            try:
                if dev.handle is None:
                    dev.handle = self.nvml.nvmlDeviceGetHandleByIndex(dev.index)
                out += self._check_ecc(dev)
                out += self._check_remap(dev)
                self._check_retirement(dev)
                out += self._check_action(dev)
                out += self._check_clocks(dev)
            except self.nvml.NVMLError as e:
                out += self._lost_or_log(dev, e, "polling")
        return out

    def close(self) -> None:
        """Free the event set and shut NVML down (errors ignored: we are leaving)."""
        self._free_events()
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    # --- checks --------------------------------------------------------------------------

    def _check_ecc(self, dev: _Device) -> list[HealthEvent]:
        if not dev.ecc_supported:
            return []
        nv = self.nvml
        try:
            total = int(
                nv.nvmlDeviceGetTotalEccErrors(
                    dev.handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                )
            )
        except nv.NVMLError as e:
            if e.value != NOT_SUPPORTED:
                raise
            dev.ecc_supported = False
            return []
        before, dev.ecc = dev.ecc, total
        if total <= before:
            return []
        text = f"uncorrected ECC errors rose from {before} to {total} (volatile count)"
        return [self._event(dev, "ecc-uncorrected", text, key=("ecc", total))]

    def flags(self) -> dict[str, list[int]]:
        """Indices of the devices lost, with a failed row remap, or with a row remap or page
        retirement that waits for a reset (as last polled)."""
        return {
            "lost": [d.index for d in self.devices if d.lost],
            "remap_failed": [d.index for d in self.devices if d.remap_failed],
            "retirement_pending": [
                d.index for d in self.devices if d.remap_pending or d.retirement_pending
            ],
        }

    def _check_retirement(self, dev: _Device) -> None:
        # Pre-Ampere GPUs retire pages instead of remapping rows; the retirement is pending
        # until the driver reloads. Ampere and later answer NOT_SUPPORTED.
        getter = getattr(self.nvml, "nvmlDeviceGetRetiredPagesPendingStatus", None)
        if not dev.retirement_supported or getter is None:
            return
        try:
            dev.retirement_pending = bool(getter(dev.handle))
        except self.nvml.NVMLError as e:
            if e.value != NOT_SUPPORTED:
                raise
            dev.retirement_supported = False

    def _check_remap(self, dev: _Device) -> list[HealthEvent]:
        if not dev.remap_supported or dev.remap_failed:
            return []
        try:
            _corr, _unc, pending, failure = self.nvml.nvmlDeviceGetRemappedRows(dev.handle)
        except self.nvml.NVMLError as e:
            if e.value != NOT_SUPPORTED:
                raise
            dev.remap_supported = False
            return []
        dev.remap_pending = bool(pending)
        if not failure:
            return []
        dev.remap_failed = True
        text = "row remapping failed: no spare rows left for an uncorrectable memory error"
        return [self._event(dev, "row-remap-failure", text, key=("remap",))]

    def _check_action(self, dev: _Device) -> list[HealthEvent]:
        if not dev.action_supported:
            return []
        value = self._recovery_action(dev)
        if value is None:
            dev.action_supported = False
            return []
        before, dev.action = dev.action, value
        if value == before or value == 0:
            return []
        action = RECOVERY_ACTIONS.get(value)
        name = action.value if action is not None else f"unknown value {value}"
        event = self._event(
            dev, "xid154", f"driver recovery action is now {name}", key=("action", value)
        )
        return [event.model_copy(update={"driver_action": action})]

    def _check_clocks(self, dev: _Device) -> list[HealthEvent]:
        if not dev.clocks_supported:
            return []
        nv = self.nvml
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        try:
            if getter is None:
                raise nv.NVMLError(NOT_SUPPORTED)
            reasons = int(getter(dev.handle))
        except nv.NVMLError as e:
            if e.value != NOT_SUPPORTED:
                raise
            dev.clocks_supported = False
            return []
        held = [name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit]
        if not held:
            dev.slowed_polls = 0
            return []
        dev.slowed_polls += 1
        if dev.slowed_polls != SLOWDOWN_POLLS:
            return []  # not yet, or reported for this episode already
        also = ", sw-power-cap" if reasons & SW_POWER_CAP else ""
        text = (
            f"clocks held back by {', '.join(held)}{also} (reasons {reasons:#x}) on "
            f"{SLOWDOWN_POLLS} polls in a row{self._sm_clocks(dev)}"
        )
        return [self._event(dev, "gpu-slowdown", text, key=("slow", reasons, self._poll_mark()))]

    def _sm_clocks(self, dev: _Device) -> str:
        """``; SM clock N of M MHz`` where NVML tells, else nothing."""
        nv = self.nvml
        sm = getattr(nv, "NVML_CLOCK_SM", 1)
        try:
            now = int(nv.nvmlDeviceGetClockInfo(dev.handle, sm))
            top = int(nv.nvmlDeviceGetMaxClockInfo(dev.handle, sm))
        except (nv.NVMLError, AttributeError):
            return ""
        return f"; SM clock {now} of {top} MHz"

    def _poll_mark(self) -> int:
        """Tells one slowdown episode's event from the next one's."""
        return round(self.clock.now().mono)

    def _recovery_action(self, dev: _Device) -> int | None:
        """The driver's recovery action, or None where neither the binding nor the driver
        offers it (older nvidia-ml-py: through the field-value API)."""
        nv = self.nvml
        getter = getattr(nv, "nvmlDeviceGetGpuRecoveryAction", None)
        try:
            if getter is not None:
                return int(getter(dev.handle))
            field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
            if field_id is None:
                return None
            (value,) = nv.nvmlDeviceGetFieldValues(dev.handle, [field_id])
        except nv.NVMLError as e:
            if e.value in LOST_CODES:
                raise
            return None
        if value.nvmlReturn in LOST_CODES:
            raise nv.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal) if value.nvmlReturn == 0 else None

    # --- plumbing ------------------------------------------------------------------------

    def _register(self, found: list[HealthEvent]) -> None:
        nv = self.nvml
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self.log(f"nvml: cannot create an event set ({e}); polling only")
            return
        registered = 0
        for dev in self.devices:
            if dev.handle is None or dev.lost:
                continue
            try:
                mask = nv.nvmlEventTypeXidCriticalError & nv.nvmlDeviceGetSupportedEventTypes(
                    dev.handle
                )
                if mask:
                    nv.nvmlDeviceRegisterEvents(dev.handle, mask, self._events)
                    registered += 1
            except nv.NVMLError as e:
                found += self._lost_or_log(dev, e, "registering XID events on")
        if registered == 0:
            self._free_events()

    def _xid_state(self) -> str:
        return "registered" if self._events is not None else "not supported (polling only)"

    def _free_events(self) -> None:
        if self._events is not None:
            events, self._events = self._events, None
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(events)

    def _device_of(self, handle: Any) -> _Device | None:
        try:
            index = int(self.nvml.nvmlDeviceGetIndex(handle))
        except self.nvml.NVMLError:
            index = -1
        for dev in self.devices:
            if dev.index == index or (index < 0 and dev.handle == handle):
                return dev
        return None

    def _lost_or_log(self, dev: _Device, error: Any, doing: str) -> list[HealthEvent]:
        if getattr(error, "value", None) not in LOST_CODES:
            self.log(f"nvml: {doing} device {dev.index} failed: {error}")
            return []
        if dev.lost:
            return []
        dev.lost = True
        text = f"GPU is lost ({error}) while {doing} it through NVML; it needs a reset"
        return [self._event(dev, "gpu-lost", text, key=("lost",))]

    def _event(
        self, dev: _Device | None, fault: str, text: str, *, key: tuple[object, ...]
    ) -> HealthEvent:
        index = dev.index if dev is not None else None
        return HealthEvent(
            id=event_id(self.node, "nvml", self.boot_id, index, fault, *key),
            node=self.node,
            source=Source.nvml,
            fault=fault,
            accelerator=index,
            bus_id=dev.bus_id if dev is not None else None,
            observed_at=self.clock.now().wall,
            message=f"GPU {index if index is not None else '?'}: {text}"[:2048],
            agent_version=self.agent_version,
        )


def _bus_id(pci: Any) -> str | None:
    """NVML's bus id (``busId``, bytes or str) in the canonical form, or None if odd."""
    raw = getattr(pci, "busId", b"")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        return nvml_bus_id(text)
    except ValueError:
        return None
