"""TPU health from the TPU runtime's own status service.

The runtime of a running TPU workload serves ``tpu.monitoring.runtime.RuntimeMetricService``
on localhost:8431; :mod:`agents.tpu_grpc` talks to it. This module only decides:

* a core whose state carries an ``error_message`` -> ``tpu-runtime-error`` (once per core,
  launch and message);
* the runtime was answering and stops answering while a workload is registered on this node
  -> ``tpu-runtime-gone`` (once per disappearance);
* no runtime answering and no workload registered -> nothing: no TPU workload runs, which is
  not a fault (NVIDIA nodes, idle TPU nodes).

Whether a workload is registered is not the runtime's to say (a job that ends normally also
takes its runtime away), so the caller passes ``workload_registered``: the agent's wiring
answers it from what it knows (a Slurm job step on the node, a marker the training job writes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from agents.accel import AcceleratorSummary
from agents.ids import event_id
from recovery.model import HealthEvent, Source
from recovery.ports.clock import Clock

Emit = Callable[[HealthEvent], None]
Log = Callable[[str], None]


@dataclass(frozen=True)
class CoreState:
    """One TPU core as the runtime reports it; ``error`` is empty while the core is healthy."""

    core: int
    chip: int
    launch_id: int = 0
    error: str = ""


class RuntimeUnreachable(Exception):
    """No TPU runtime answers (connection refused, nothing listening)."""


class RuntimeQueryFailed(Exception):
    """The runtime answered, but not with a status (timeout, unimplemented, ...)."""


class TpuRuntime(Protocol):
    """What the TPU source asks of the runtime."""

    def core_states(self) -> list[CoreState]:
        """Every core's current state. Raises :class:`RuntimeUnreachable` when no runtime
        answers, :class:`RuntimeQueryFailed` for any other failure."""
        ...


@dataclass
class TpuSource:
    """Polls the runtime every ``interval_s`` seconds and reports faults as events."""

    node: str
    boot_id: str
    clock: Clock
    runtime: TpuRuntime
    workload_registered: Callable[[], bool]
    log: Log = print
    interval_s: float = 5.0
    agent_version: str = ""
    summary: AcceleratorSummary | None = None
    """Told the chips the runtime answers for (the heartbeat's ``accelerators``)."""
    _up_since: float | None = field(default=None, init=False, repr=False)
    _reported: set[tuple[int, int, str]] = field(default_factory=set, init=False, repr=False)
    _said_absent: bool = field(default=False, init=False, repr=False)
    _last_failure: str = field(default="", init=False, repr=False)

    def run(self, emit: Emit, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            for event in self.poll_once():
                emit(event)
            stop.wait(self.interval_s)

    def poll_once(self) -> list[HealthEvent]:
        """Ask the runtime once; the events its answer (or its absence) calls for."""
        try:
            cores = self.runtime.core_states()
        except RuntimeUnreachable as e:
            return self._unreachable(str(e))
        except RuntimeQueryFailed as e:
            if str(e) != self._last_failure:  # one line per distinct failure, not per poll
                self.log(f"tpu: runtime status query failed: {e}")
                self._last_failure = str(e)
            return []
        self._last_failure = ""
        if self.summary is not None:
            # The chips the runtime answers for (its errors are faults of their own, counted
            # where the agent sees every fault).
            self.summary.devices_from("tpu", len({c.chip for c in cores}), None)
        if self._up_since is None:
            self._up_since = self.clock.now().mono
            self._said_absent = False
            self.log(f"tpu: runtime answering, {len(cores)} core(s)")
        return [self._core_error(c) for c in cores if c.error and self._first(c)]

    def _first(self, core: CoreState) -> bool:
        key = (core.core, core.launch_id, core.error)
        if key in self._reported:
            return False
        self._reported.add(key)
        return True

    def _unreachable(self, why: str) -> list[HealthEvent]:
        up_since, self._up_since = self._up_since, None
        registered = self.workload_registered()
        if up_since is None or not registered:
            if not self._said_absent:
                state = "a workload is registered" if registered else "no TPU workload"
                self.log(f"tpu: no runtime answering ({why}); {state}: not a fault")
                self._said_absent = True
            return []
        self._said_absent = True
        return [
            self._event(
                "tpu-runtime-gone",
                None,
                f"TPU runtime stopped answering while a workload was registered ({why})",
                key=("gone", round(up_since * 1000)),
            )
        ]

    def _core_error(self, core: CoreState) -> HealthEvent:
        return self._event(
            "tpu-runtime-error",
            core.chip,
            f"TPU core {core.core} (chip {core.chip}, launch {core.launch_id}): {core.error}",
            key=("core", core.core, core.launch_id, core.error),
        )

    def _event(
        self, fault: str, chip: int | None, text: str, *, key: tuple[object, ...]
    ) -> HealthEvent:
        return HealthEvent(
            id=event_id(self.node, "tpu", self.boot_id, fault, *key),
            node=self.node,
            source=Source.tpu,
            fault=fault,
            accelerator=chip,
            observed_at=self.clock.now().wall,
            message=text[:2048],
            agent_version=self.agent_version,
        )
