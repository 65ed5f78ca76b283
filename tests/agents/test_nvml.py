"""The NVML source against a stand-in at the pynvml boundary, and once against the real NVML."""

from __future__ import annotations

import sys
import threading

import pytest

from agents.nvml import NvmlSource, load_pynvml
from recovery.model import DriverAction, HealthEvent, Source
from recovery.ports.clock import FakeClock
from tests.agents.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeGpu,
    FakeNvml,
)
from tests.agents.helpers import wait_for

BUSES = ["00000000:18:00.0", "00000000:3B:00.0"]


def _source(nvml: FakeNvml, clock: FakeClock, logs: list[str]) -> NvmlSource:
    return NvmlSource(
        node="gpu-n3", boot_id="b1", clock=clock, nvml=nvml, log=logs.append, wait_ms=10
    )


@pytest.fixture
def logs() -> list[str]:
    return []


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(gpus=[FakeGpu(b) for b in BUSES])


def test_xid_events_become_health_events(nvml: FakeNvml, clock: FakeClock, logs: list[str]) -> None:
    src = _source(nvml, clock, logs)
    assert src.start() == []
    assert "watching 2 device(s); XID events registered" in logs[-1]
    assert src.wait_once() == []  # timeout
    nvml.inject_xid(1, 79)
    (event,) = src.wait_once()
    assert (event.source, event.fault, event.accelerator) == (Source.nvml, "xid79", 1)
    assert event.bus_id == "00000000:3B:00.0"
    assert event.observed_at == clock.now().wall
    nvml.inject_xid(1, 79)
    (again,) = src.wait_once()
    assert again.id != event.id, "two events are two observations"


def test_a_lost_gpu_at_start_is_reported(nvml: FakeNvml, clock: FakeClock, logs: list[str]) -> None:
    nvml.gpus[0].lost = True
    src = _source(nvml, clock, logs)
    (event,) = src.start() or []
    assert (event.fault, event.accelerator) == ("gpu-lost", 0)
    assert "GPU is lost" in event.message
    assert src.poll_once() == [], "reported once"


def test_a_gpu_lost_while_polling_is_reported_once(
    nvml: FakeNvml, clock: FakeClock, logs: list[str]
) -> None:
    src = _source(nvml, clock, logs)
    src.start()
    assert src.poll_once() == []
    nvml.gpus[1].lost = True
    (event,) = src.poll_once()
    assert (event.fault, event.accelerator, event.bus_id) == ("gpu-lost", 1, BUSES[1])
    assert src.poll_once() == []
    # A restarted agent observing the same loss gives the same id (dropped as a duplicate).
    again = _source(nvml, clock, logs).start()
    assert again is not None
    assert [e.id for e in again] == [event.id]


def test_ecc_rises_and_remap_failures_are_reported(
    nvml: FakeNvml, clock: FakeClock, logs: list[str]
) -> None:
    src = _source(nvml, clock, logs)
    src.start()
    assert src.poll_once() == []
    nvml.gpus[0].ecc_uncorrected = 2
    nvml.gpus[1].remap_failure = True
    events = src.poll_once()
    assert [(e.fault, e.accelerator) for e in events] == [
        ("ecc-uncorrected", 0),
        ("row-remap-failure", 1),
    ]
    assert "rose from 0 to 2" in events[0].message
    assert src.poll_once() == [], "no change, no event"
    nvml.gpus[0].ecc_uncorrected = 3
    assert [e.fault for e in src.poll_once()] == ["ecc-uncorrected"]


def test_unsupported_counters_are_skipped(
    nvml: FakeNvml, clock: FakeClock, logs: list[str]
) -> None:
    nvml.gpus[0].ecc_supported = False
    src = _source(nvml, clock, logs)
    src.start()
    assert src.poll_once() == []
    assert src.devices[0].ecc_supported is False


@pytest.mark.parametrize("getter", [True, False], ids=["recovery-getter", "field-values"])
@pytest.mark.parametrize(
    ("value", "action"),
    [
        (1, DriverAction.gpu_reset),
        (2, DriverAction.node_reboot),
        (3, DriverAction.drain_p2p),
        (4, DriverAction.drain_and_reset),
        (5, None),
    ],
)
def test_driver_recovery_action_becomes_xid154(
    clock: FakeClock, logs: list[str], getter: bool, value: int, action: DriverAction | None
) -> None:
    nvml = FakeNvml(gpus=[FakeGpu(BUSES[0])], with_recovery_getter=getter)
    src = _source(nvml, clock, logs)
    src.start()
    assert src.poll_once() == []
    nvml.gpus[0].recovery_action = value
    (event,) = src.poll_once()
    assert (event.fault, event.driver_action, event.accelerator) == ("xid154", action, 0)
    assert src.poll_once() == []
    nvml.gpus[0].recovery_action = 0
    assert src.poll_once() == [], "back to none is not a fault"


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_without_a_driver_one_line_and_a_clean_end(
    clock: FakeClock, logs: list[str], code: int, text: str
) -> None:
    nvml = FakeNvml(init_error=code)
    src = _source(nvml, clock, logs)
    got: list[HealthEvent] = []
    src.run(got.append, threading.Event())  # returns by itself
    assert got == []
    assert len(logs) == 1
    assert logs[0].startswith(f"nvml: NVML is unavailable ({text})")
    assert "other sources keep running" in logs[0]


def test_devices_without_xid_events_are_polled_only(clock: FakeClock, logs: list[str]) -> None:
    nvml = FakeNvml(gpus=[FakeGpu(BUSES[0], xid_supported=False)])
    src = _source(nvml, clock, logs)
    src.start()
    assert "polling only" in logs[-1]
    assert "event-set-free" in nvml.calls


def test_run_delivers_events_until_stopped(
    nvml: FakeNvml, clock: FakeClock, logs: list[str]
) -> None:
    src = _source(nvml, clock, logs)
    got: list[HealthEvent] = []
    stop = threading.Event()
    t = threading.Thread(target=src.run, args=(got.append, stop))
    t.start()
    try:
        wait_for(lambda: "event-set-create" in nvml.calls, "the source to start")
        nvml.inject_xid(0, 48)
        wait_for(lambda: len(got) == 1, "the XID event")
    finally:
        stop.set()
        t.join(timeout=10)
    assert not t.is_alive()
    assert got[0].fault == "xid48"
    assert nvml.calls[-2:] == ["event-set-free", "shutdown"]


def test_missing_binding_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes ``import pynvml`` fail
    logs: list[str] = []
    assert load_pynvml(logs.append) is None
    assert len(logs) == 1
    assert logs[0].startswith("nvml: NVML is unavailable (nvidia-ml-py is not installed: ")


@pytest.mark.gpu
def test_real_nvml_reads_every_device(clock: FakeClock) -> None:
    """On a machine with NVIDIA GPUs: start, poll every device once, and stop cleanly."""
    logs: list[str] = []
    nvml = load_pynvml(logs.append)
    assert nvml is not None, logs
    src = NvmlSource(node="gpu-real", boot_id="b", clock=clock, nvml=nvml, log=logs.append)
    found = src.start()
    assert found is not None, logs
    try:
        assert src.devices, "NVML lists no device"
        assert all(d.bus_id for d in src.devices if not d.lost)
        events = found + src.poll_once()
        events += src.wait_once()  # an XID may really happen; waiting must not raise
        assert all(e.source == Source.nvml for e in events)
        seen = [(e.fault, e.accelerator) for e in events]
        print(f"NVML: {len(src.devices)} devices, buses {[d.bus_id for d in src.devices]}")
        print(f"NVML health events now: {seen}")
        print("\n".join(logs))
    finally:
        src.close()


def test_clocks_held_back_by_heat_or_power_are_reported_once_an_episode(
    nvml: FakeNvml, clock: FakeClock, logs: list[str]
) -> None:
    src = _source(nvml, clock, logs)
    src.start()
    nvml.gpus[1].clock_reasons = 0x4 | 0x1  # power capped at full load, or idle: how it runs
    assert [src.poll_once() for _ in range(5)] == [[]] * 5
    nvml.gpus[1].clock_reasons = 0x4 | 0x40 | 0x20  # and now hot
    nvml.gpus[1].sm_clock = 1005
    seen = [src.poll_once() for _ in range(6)]
    assert [len(s) for s in seen] == [0, 0, 1, 0, 0, 0]  # after 3 polls in a row, once
    (event,) = seen[2]
    assert (event.fault, event.accelerator, event.source) == ("gpu-slowdown", 1, Source.nvml)
    assert event.message == (
        "GPU 1: clocks held back by sw-thermal, hw-thermal, sw-power-cap (reasons 0x64) on 3 "
        "polls in a row; SM clock 1005 of 1980 MHz"
    )
    nvml.gpus[1].clock_reasons = 0x4  # cooled down: the episode ends
    assert src.poll_once() == []
    clock.advance(60)
    nvml.gpus[1].clock_reasons = 0x8  # a new one
    again = [e for _ in range(3) for e in src.poll_once()]
    assert [e.fault for e in again] == ["gpu-slowdown"]
    assert again[0].id != event.id


def test_a_moment_held_back_and_unsupported_reasons_are_quiet(
    nvml: FakeNvml, clock: FakeClock, logs: list[str]
) -> None:
    nvml.gpus[0].clock_reasons = None  # NOT_SUPPORTED: asked once, then left alone
    src = _source(nvml, clock, logs)
    src.start()
    nvml.gpus[1].clock_reasons = 0x80
    assert src.poll_once() == []
    assert src.poll_once() == []
    nvml.gpus[1].clock_reasons = 0
    assert src.poll_once() == []  # two polls, then clear: a moment, not an episode
    assert not src.devices[0].clocks_supported
    old = FakeNvml(gpus=[FakeGpu(BUSES[0], clock_reasons=0x40)], with_clocks_getter=False)
    legacy = _source(old, clock, logs)
    legacy.start()
    assert [e for _ in range(3) for e in legacy.poll_once()] == []  # no getter at all
