"""What an agent says of its node's accelerators in every heartbeat (``agents/accel.py``):
NVML's count and the devices lost, with a failed row remap or waiting for a reset; the
accelerator faults it reported, whatever source saw them, and nothing else."""

from __future__ import annotations

from agents.accel import AcceleratorSummary, is_accelerator_fault
from agents.nvml import NvmlSource
from recovery.model import HealthEvent, Source
from recovery.ports.clock import FakeClock
from tests.agents.fake_nvml import FakeGpu, FakeNvml


def _event(fault: str, source: Source, at: float = 100.0) -> HealthEvent:
    return HealthEvent(id=f"{fault}-{at}", node="n1", source=source, fault=fault, observed_at=at)


def test_nvml_counts_the_devices_and_flags_the_bad_ones() -> None:
    gpus = [FakeGpu(f"00000000:{i:02X}:00.0", retirement_pending=False) for i in range(4)]
    summary = AcceleratorSummary()
    source = NvmlSource("n1", "b1", FakeClock(), FakeNvml(gpus=gpus), log=lambda _: None,
                        summary=summary)  # fmt: skip
    source.start()
    assert summary.to_json() == {
        "source": "nvml", "devices": 4, "lost": [], "remap_failed": [],
        "retirement_pending": [], "faults": 0, "last_fault": "", "last_fault_at": None,
    }  # fmt: skip
    gpus[0].lost = True
    gpus[1].remap_failure = True
    gpus[2].remap_pending = True
    gpus[3].retirement_pending = True
    source.poll_once()
    said = summary.to_json()
    assert said["lost"] == [0]
    assert said["remap_failed"] == [1]
    assert said["retirement_pending"] == [2, 3]
    gpus[2].remap_pending = False
    gpus[3].retirement_pending = False
    source.poll_once()
    assert summary.to_json()["retirement_pending"] == []


def test_accelerator_faults_are_counted_from_every_source_and_nothing_else() -> None:
    summary = AcceleratorSummary("simulated", 8)
    for event in (
        _event("xid79", Source.kmsg, 100.0),
        _event("xid48", Source.nvml, 120.0),
        _event("tpu-runtime-gone", Source.tpu, 110.0),
        _event("node-slow", Source.progress, 130.0),
        _event("rank-hang", Source.progress, 131.0),
        _event("node-hang", Source.injected, 132.0),
        _event("heartbeat-lost", Source.heartbeat, 133.0),
    ):
        summary.saw(event)
    said = summary.to_json()
    assert (said["source"], said["devices"]) == ("simulated", 8)
    assert said["faults"] == 3
    assert (said["last_fault"], said["last_fault_at"]) == ("xid48", 120.0)
    assert is_accelerator_fault(_event("xid79", Source.injected))
    assert not is_accelerator_fault(_event("node-slow-swap", Source.progress))
