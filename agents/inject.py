"""Carrying out the coordinator's ``inject`` commands, through the agent's real detection path.

* ``via agent``: the fault becomes a HealthEvent (source ``injected``, ``injected=True``, the id
  the coordinator chose) handed to the agent's pipeline like any source's event: deduplicated,
  spooled, published. The command is acknowledged once the event is spooled (or folded).
* ``via kmsg``: a genuine-looking ``NVRM: Xid ...`` line is appended to the kernel log the
  agent follows (its ``--kmsg-file``, or ``/dev/kmsg`` as root), carrying the marker
  ``[recover-inject <command id>]``; the agent's own kernel-log follower then finds it, so the
  parser is exercised too. The event is not flagged injected (nothing in a kernel line can say
  so) but its message keeps the marker. For a plain file the event id is known at once (the
  parser derives it from the line); for ``/dev/kmsg`` it depends on the time stamp the kernel
  gives the record, which only the follower learns, so the acknowledgement carries no id.

Repeats of one fault on one GPU within the deduplication window are folded, exactly as real
repeats are: inject on another ``--gpu`` to get a first occurrence again.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.follow import append_fault_line
from agents.kmsg import kmsg_event_id, parse_line
from recovery.model import HealthEvent, Source
from recovery.ports.clock import Clock

#: Hands an event to the pipeline; True once it is spooled (or folded), False on timeout.
Submit = Callable[[HealthEvent], bool]


def simulated_bus(gpu: int) -> str:
    """A made-up NVML bus id for GPU ``gpu`` (0-1023) of a simulated node:
    ``00000000:<gpu % 256>:<gpu // 256>.0``."""
    return f"00000000:{gpu % 256:02X}:{gpu // 256:02X}.0"


def simulated_buses(count: int) -> dict[str, int]:
    """A bus map (as :func:`agents.kmsg.bus_map` makes) for ``count`` simulated GPUs."""
    return {simulated_bus(i): i for i in range(count)}


@dataclass
class Injector:
    """Carries out ``inject`` commands for ``node``; ``kmsg_path`` is None when the agent runs
    no kernel-log source (then ``via kmsg`` is refused with the reason)."""

    node: str
    boot_id: str
    clock: Clock
    submit: Submit
    kmsg_path: Path | None
    buses: Mapping[str, int]
    agent_version: str = ""

    def carry_out(self, command: Mapping[str, Any]) -> dict[str, Any]:
        """The result to acknowledge ``command`` with: ``{"event_id": ..., "line": ...}``, or
        ``{"error": why}`` when it cannot be done here (never raises for a bad command)."""
        args = command.get("args", {})
        fault, gpu, via = args.get("fault"), args.get("gpu"), args.get("via", "agent")
        if not isinstance(fault, str) or not (gpu is None or isinstance(gpu, int)):
            return {"error": f"malformed inject command: {dict(args)}"}
        try:
            if via == "agent":
                return self._via_agent(str(command.get("id")), fault, gpu, args.get("event_id"))
            if via == "kmsg":
                return self._via_kmsg(str(command.get("id")), fault, gpu)
        except (OSError, ValueError) as e:
            return {"error": f"could not inject {fault} via {via}: {e}"}
        return {"error": f"unknown injection path {via!r}; known: agent, kmsg"}

    def bus_of(self, gpu: int | None) -> str:
        """The NVML bus id of ``gpu`` (its real one when known), GPU 0 when None."""
        index = gpu or 0
        for bus, i in self.buses.items():
            if i == index:
                return bus
        return simulated_bus(index)

    def _via_agent(
        self, command_id: str, fault: str, gpu: int | None, event_id: object
    ) -> dict[str, Any]:
        if not isinstance(event_id, str):
            return {"error": "inject via agent needs the event id the coordinator chose"}
        event = HealthEvent(
            id=event_id,
            node=self.node,
            source=Source.injected,
            fault=fault,
            accelerator=gpu,
            bus_id=self.bus_of(gpu) if gpu is not None else None,
            observed_at=self.clock.now().wall,
            message=f"injected by recover inject (command {command_id})",
            injected=True,
            agent_version=self.agent_version,
        )
        if not self.submit(event):
            return {"error": "the agent's pipeline did not take the event in time"}
        return {"event_id": event.id}

    def _via_kmsg(self, command_id: str, fault: str, gpu: int | None) -> dict[str, Any]:
        if self.kmsg_path is None:
            return {"error": "this agent runs no kernel-log source (add kmsg to --sources)"}
        line = append_fault_line(
            self.kmsg_path,
            fault,
            self.bus_of(gpu),
            clock=self.clock,
            note=f"recover-inject {command_id}",
        )
        parsed = parse_line(line)
        is_char = stat.S_ISCHR(self.kmsg_path.stat().st_mode)
        if parsed is None or is_char:  # /dev/kmsg: the id depends on the kernel's time stamp
            return {"event_id": None, "line": line.rstrip("\n")}
        return {"event_id": kmsg_event_id(self.node, self.boot_id, parsed), "line": line.strip()}
