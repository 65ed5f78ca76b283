"""A stand-in for the ``pynvml`` module, shaped like nvidia-ml-py at the calls the NVML source
makes: error classes carrying ``.value`` (NVML return codes), the constants, and per-device
state the tests change (XID events queued, ECC counts, remapped rows, recovery action, lost).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
_TEXT = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
}


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` with ``.value``; ``str()`` is NVML's text."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _TEXT.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeGpu:
    """One device: change its fields to make NVML report something."""

    bus_id: str
    lost: bool = False
    ecc_uncorrected: int = 0
    ecc_supported: bool = True
    remap_failure: bool = False
    remap_pending: bool = False
    retirement_pending: bool | None = None
    """A page retirement waits for a driver reload; None: not supported (Ampere and later)."""
    recovery_action: int = 0
    xid_supported: bool = True
    clock_reasons: int | None = 0
    """NVML's clock event reasons bitmask; None: not supported."""
    sm_clock: int = 1980
    sm_max: int = 1980


@dataclass
class FakeNvml:
    """Module-like object: ``FakeNvml(gpus=[...])`` then pass it as ``nvml=``."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None
    with_recovery_getter: bool = True
    with_clocks_getter: bool = True
    calls: list[str] = field(default_factory=list)
    xids: queue.Queue[tuple[int, int]] = field(default_factory=queue.Queue)

    NVMLError = NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeSingleBitEccError = 0x1

    NVML_CLOCK_SM = 1

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlDeviceGetGpuRecoveryAction" and self.with_recovery_getter:
            return self._recovery_action
        if name == "nvmlDeviceGetCurrentClocksEventReasons" and self.with_clocks_getter:
            return self._clock_reasons
        raise AttributeError(name)

    def _clock_reasons(self, handle: Any) -> int:
        reasons = self._gpu(handle).clock_reasons
        if reasons is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return reasons

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self._gpu(handle).sm_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self._gpu(handle).sm_max

    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID critical-error event for device ``index``."""
        self.xids.put((index, xid))

    def _gpu(self, handle: Any) -> FakeGpu:
        gpu: FakeGpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    # --- the pynvml calls ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return int(handle.index)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=self._gpu(handle).bus_id.encode())

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return 0x9 if gpu.xid_supported else 0x1

    def nvmlEventSetCreate(self) -> Any:
        self.calls.append("event-set-create")
        return SimpleNamespace(registered=[])

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, es: Any) -> None:
        assert mask == self.nvmlEventTypeXidCriticalError, "register XID critical errors only"
        es.registered.append(handle.index)

    def nvmlEventSetWait_v2(self, es: Any, timeout_ms: int) -> Any:
        try:
            index, xid = self.xids.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        return SimpleNamespace(
            device=SimpleNamespace(index=index),
            eventType=self.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    def nvmlEventSetFree(self, es: Any) -> None:
        self.calls.append("event-set-free")

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "uncorrected, volatile"
        gpu = self._gpu(handle)
        if not gpu.ecc_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle)
        pending = 1 if gpu.remap_pending else 0
        return (0, 1 if gpu.remap_failure else 0, pending, 1 if gpu.remap_failure else 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        pending = self._gpu(handle).retirement_pending
        if pending is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 1 if pending else 0

    def _recovery_action(self, handle: Any) -> int:
        return self._gpu(handle).recovery_action

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> list[Any]:
        assert field_ids == [self.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        gpu = self.gpus[handle.index]
        ret = NVML_ERROR_GPU_IS_LOST if gpu.lost else NVML_SUCCESS
        value = SimpleNamespace(uiVal=gpu.recovery_action)
        return [SimpleNamespace(fieldId=field_ids[0], nvmlReturn=ret, value=value)]
