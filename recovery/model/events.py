"""The one health-event schema: what agents, Slurm and Kubernetes watchers report, what the
intake validates, what the journal stores and what the policy decides on.

Versioned (``version``); unknown fields are rejected with the field named (pydantic's
``extra="forbid"``). Agents generate ``id``, stable across resends, so the coordinator can
drop duplicates.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

#: Version of the event schema this code reads and writes.
SCHEMA_VERSION = 1

#: Event ids: what an agent may choose (uuid4 hex, ``node-seq``, a digest, ...).
EVENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: Node names, as Slurm accepts them (see recovery.ports.slurm.NODE_NAME_RE).
NODE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$"
#: Fault codes: ``xid<N>`` (a GPU's XID), ``sxid<N>`` (an NVSwitch's SXid, its own family) or
#: a lower-case name (``gpu-lost``, ``gpu-reset-required``, ``node-unreachable``, ...).
#: Whether the code is known is the fault catalogue's business, not the schema's.
FAULT_PATTERN = r"^[a-z][a-z0-9-]{0,47}$"
#: A PCI bus id in NVML's form (``00000000:3B:00.0``) or the kernel's (``0000:3b:00``).
BUS_ID_PATTERN = r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(\.[0-7])?$"


class Source(StrEnum):
    """Where an event was observed."""

    nvml = "nvml"
    kmsg = "kmsg"
    tpu = "tpu"
    slurm = "slurm"
    k8s = "k8s"
    heartbeat = "heartbeat"
    injected = "injected"
    operator = "operator"
    """An operator's statement through the coordinator (``recover node repaired``)."""
    progress = "progress"
    """A training job's own progress reports, judged by the node's agent (hangs)."""


class DriverAction(StrEnum):
    """The recovery action NVIDIA's driver asks for (XID 154, ``nvmlDeviceGetGpuRecoveryAction``
    values 0-4)."""

    none = "none"
    drain_p2p = "drain-p2p"
    drain_and_reset = "drain-and-reset"
    gpu_reset = "gpu-reset"
    node_reboot = "node-reboot"


#: The fault code of an operator's "this node is repaired" (source ``operator``).
REPAIRED = "node-repaired"
#: The fault code the coordinator gives a node it took out that Slurm shows in service again
#: without us (an operator's ``scontrol update state=resume``, a cluster started anew): its
#: incident no longer holds the node out; its failures still count.
RETURNED = "node-returned"
#: The fault code the coordinator gives a job of ours that Slurm holds (REQUEUE_HOLD: 25.11's
#: expedited requeue of a run that failed while no Epilog failed) and no node's fault claims:
#: its incident says why, and what was done (released, or left held and why).
HELD = "job-held"
#: The fault code the coordinator gives a node Slurm reports DOWN that no agent reported.
UNREACHABLE = "node-unreachable"
#: The fault code of a node whose agent stopped sending heartbeats (a suspect).
HEARTBEAT_LOST = "heartbeat-lost"

EventId = Annotated[str, StringConstraints(pattern=EVENT_ID_PATTERN)]
NodeName = Annotated[str, StringConstraints(pattern=NODE_PATTERN)]
FaultCode = Annotated[str, StringConstraints(pattern=FAULT_PATTERN)]


class HealthEvent(BaseModel):
    """One observation of a node's health.

    ``observed_at`` is the observer's wall clock (Unix seconds); ``count`` > 1 means this event
    stands for that many identical observations folded together by deduplication.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    version: Literal[1] = 1
    id: EventId
    node: NodeName
    source: Source
    fault: FaultCode
    accelerator: Annotated[int, Field(ge=0, le=1023)] | None = None
    bus_id: Annotated[str, StringConstraints(pattern=BUS_ID_PATTERN)] | None = None
    observed_at: Annotated[float, Field(ge=0, le=4e9)]
    count: Annotated[int, Field(ge=1, le=10**9)] = 1
    message: Annotated[str, StringConstraints(max_length=2048)] = ""
    injected: bool = False
    agent_version: Annotated[str, StringConstraints(max_length=64)] = ""
    driver_action: DriverAction | None = None
    """What the driver says this occurrence needs, where it says so: XID 154's new recovery
    action (it overrides the catalogue's), and ``none`` for an NVSwitch error (``sxid<N>``)
    the driver reported non-fatal (it is then only observed)."""


class EventBatch(BaseModel):
    """Several events in one request; the intake commits them in one transaction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    events: Annotated[list[HealthEvent], Field(min_length=1, max_length=10_000)]
