"""The agent-facing routes: heartbeats, the command channel, fault injection, decision lookup.

* ``POST /v1/heartbeat`` - an agent says it is alive (its node's token). Recorded in memory
  (:class:`HeartbeatTracker`), never journaled: a beat every 5 s from 1,000 nodes would be
  200 writes/s of nothing. The engine asks :meth:`HeartbeatTracker.silent` for nodes to suspect.
  The answer carries the site's progress thresholds (the policy file's ``progress``), which
  the agent judges jobs by.
* ``GET /v1/agents/{node}/commands?wait=S`` - the agent's long poll (that node's token only);
  ``POST /v1/agents/{node}/commands/{id}/ack`` - its result (:mod:`service.httpapi.commands`).
* ``GET /v1/agents`` - per node with a token: connected, last poll/heartbeat age, version.
* ``POST /v1/inject`` (admin) - a fault for a node's agent to emit through its own detection
  path; answered with the event id once the agent carried it out.
* ``GET /v1/events/{id}/decision`` - whether the event is stored and the coordinator's decision
  on it (null until there is one), for ``recover inject --wait``.

Refusals of ``/v1/inject`` (nothing is queued or recorded in any of them): 422 unknown fault
(naming the known ones) or one the kernel-log path cannot write, 404 unknown node (naming the
nodes with a token), 409 the node's agent is not connected, 504 the agent did not carry the
command out in time (the command is dropped).
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations.

import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Body, Depends, FastAPI, HTTPException, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from recovery.errors import UsageError, unknown_choice
from recovery.model.events import NODE_PATTERN
from recovery.ports.clock import Clock
from recovery.ports.journal import Journal
from service.httpapi.auth import Principal, TokenTable
from service.httpapi.commands import MAX_WAIT_S, CommandBroker

#: How often agents are asked to beat (seconds); the default of ``recover agent run``.
HEARTBEAT_S = 5.0


class HeartbeatTracker:
    """Last heartbeat (monotonic seconds, from ``clock``) and agent version per node.

    Thread-safe: the server's loop records, the engine's thread reads.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, str]] = {}
        self._accelerators: dict[str, dict[str, Any]] = {}

    def beat(
        self, node: str, version: str = "", accelerators: Mapping[str, Any] | None = None
    ) -> float:
        """Record a heartbeat from ``node`` now (with what its agent said of its
        accelerators, when it did); returns its monotonic time."""
        now = self._clock.now().mono
        with self._lock:
            self._seen[node] = (now, version)
            if accelerators is not None:
                self._accelerators[node] = dict(accelerators)
        return now

    def accelerators(self, node: str) -> Mapping[str, Any] | None:
        """What ``node``'s agent last said of its accelerators, None if it said nothing."""
        with self._lock:
            return self._accelerators.get(node)

    def last_seen(self, node: str) -> float | None:
        """Monotonic seconds of ``node``'s last heartbeat, None if it never beat."""
        with self._lock:
            seen = self._seen.get(node)
        return None if seen is None else seen[0]

    def version(self, node: str) -> str | None:
        """The agent version ``node`` last reported, None if it never beat."""
        with self._lock:
            seen = self._seen.get(node)
        return None if seen is None else seen[1]

    def silent(self, now: float, after_s: float) -> list[str]:
        """Nodes that have beaten at least once but not for more than ``after_s`` seconds
        before ``now`` (monotonic seconds), sorted. Nodes never heard of are not listed: an
        agent that never started is the deployment's problem, not a fault of its node."""
        with self._lock:
            return sorted(n for n, (t, _) in self._seen.items() if now - t > after_s)

    def forget(self, node: str) -> None:
        """Drop ``node`` (decommissioned): it will not be reported silent."""
        with self._lock:
            self._seen.pop(node, None)


@dataclass
class AgentChannel:
    """What the agent routes share: the command broker and the heartbeat tracker, plus the
    fault codes injection accepts (the catalogue's, by default) and its wait for the agent."""

    broker: CommandBroker
    heartbeats: HeartbeatTracker
    faults: Sequence[str]
    clock: Clock
    inject_timeout_s: float = 10.0
    """How long ``POST /v1/inject`` waits for the agent, unless the request asks for less."""
    progress: Mapping[str, Any] = field(default_factory=dict)
    """The site's thresholds for judging jobs' progress (the policy file's ``progress``),
    handed to every agent in the answer to its heartbeat."""

    @classmethod
    def default(
        cls,
        clock: Clock,
        faults: Sequence[str] | None = None,
        progress: Mapping[str, Any] | None = None,
    ) -> "AgentChannel":
        if faults is None:
            from recovery.policy import load_catalogue  # the packaged catalogue, read once

            faults = load_catalogue().known()
        return cls(
            CommandBroker(clock), HeartbeatTracker(clock), tuple(faults), clock,
            progress=dict(progress or {}),
        )  # fmt: skip


class AcceleratorReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source: Annotated[str, Field(max_length=32)] = "none"
    devices: Annotated[int, Field(ge=0, le=4096)] | None = None
    lost: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=4096)] = []
    remap_failed: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=4096)] = []
    retirement_pending: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=4096)] = []
    faults: Annotated[int, Field(ge=0)] = 0
    last_fault: Annotated[str, Field(max_length=64)] = ""
    last_fault_at: float | None = None


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    node: Annotated[str, Field(pattern=NODE_PATTERN)]
    version: Annotated[str, Field(max_length=64)] = ""
    accelerators: AcceleratorReport | None = None
    """What the agent last saw of its node's accelerators (``agents/accel.py``): what the
    node checks judge."""


class InjectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fault: Annotated[str, Field(max_length=48)]
    node: Annotated[str, Field(max_length=63)]
    gpu: Annotated[int, Field(ge=0, le=1023)] | None = None
    via: Literal["agent", "kmsg"] = "agent"
    timeout_s: Annotated[float, Field(gt=0, le=60)] | None = None
    """How long to wait for the agent to carry it out (at most, and by default, the
    channel's ``inject_timeout_s``)."""


def agent_routes(
    app: FastAPI,
    channel: AgentChannel,
    *,
    journal: Journal,
    tokens: TokenTable,
    caller: Callable[..., Principal],
    admin: Callable[..., Principal],
    leading: Callable[[], None] | None = None,
) -> None:
    """Register the routes of this module's docstring on ``app``. ``leading``: a dependency
    that refuses (503) on a coordinator replica standing by: heartbeats, the command channel
    and injection live in the leader's memory, so the agents must talk to the leader."""
    only = [Depends(leading)] if leading is not None else []
    _heartbeat_routes(app, channel, tokens, caller, only)
    _command_routes(app, channel, caller, only)
    _inject_route(app, channel, tokens, admin, only)
    _decision_route(app, journal, caller)


def _own_node(who: Principal, node: str, doing: str) -> None:
    if who.node != node:
        whose = "the admin token" if who.admin else f"node {who.node}'s token"
        raise HTTPException(403, f"only node {node}'s agent token may {doing} (this is {whose})")


def _heartbeat_routes(
    app: FastAPI,
    channel: AgentChannel,
    tokens: TokenTable,
    caller: Callable[..., Principal],
    only: list[Any],
) -> None:
    @app.post("/v1/heartbeat", response_model=dict[str, Any], dependencies=only)
    def heartbeat(beat: Heartbeat, who: Annotated[Principal, Depends(caller)]) -> dict[str, Any]:
        if not who.may_report_for(beat.node):
            raise HTTPException(403, f"the token of node {who.node} may not beat for {beat.node}")
        said = beat.accelerators.model_dump() if beat.accelerators is not None else None
        channel.heartbeats.beat(beat.node, beat.version, said)
        return {"node": beat.node, "interval_s": HEARTBEAT_S, "progress": channel.progress}

    @app.get(
        "/v1/agents", response_model=list[dict[str, Any]], dependencies=[Depends(caller), *only]
    )
    def agents() -> list[dict[str, Any]]:
        now = channel.clock.now().mono
        out = []
        for node in tokens.nodes():
            poll = channel.broker.last_poll(node)
            beat = channel.heartbeats.last_seen(node)
            out.append(
                {
                    "node": node,
                    "connected": channel.broker.connected(node),
                    "last_poll_age_s": None if poll is None else round(now - poll, 3),
                    "last_heartbeat_age_s": None if beat is None else round(now - beat, 3),
                    "version": channel.heartbeats.version(node),
                    "pending_commands": channel.broker.pending(node),
                }
            )
        return out


def _command_routes(
    app: FastAPI, channel: AgentChannel, caller: Callable[..., Principal], only: list[Any]
) -> None:
    node_path = Path(pattern=NODE_PATTERN)

    @app.get("/v1/agents/{node}/commands", response_model=dict[str, Any], dependencies=only)
    async def poll(
        node: Annotated[str, node_path],
        who: Annotated[Principal, Depends(caller)],
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="seconds to hold")] = 30,
    ) -> dict[str, Any]:
        _own_node(who, node, "poll its commands")
        commands = await channel.broker.wait(node, wait)
        return {"commands": [c.to_json() for c in commands]}

    @app.post(
        "/v1/agents/{node}/commands/{command_id}/ack",
        response_model=dict[str, Any],
        dependencies=only,
    )
    def ack(
        node: Annotated[str, node_path],
        command_id: Annotated[str, Path(max_length=64)],
        who: Annotated[Principal, Depends(caller)],
        result: Annotated[dict[str, Any], Body()],
    ) -> dict[str, Any]:
        _own_node(who, node, "acknowledge its commands")
        return {"acked": channel.broker.ack(node, command_id, result)}


def check_inject(request: InjectRequest, channel: AgentChannel, tokens: TokenTable) -> None:
    """Refuse an injection that cannot be carried out: HTTPException 422 (unknown fault), 404
    (unknown node), 409 (its agent is not connected). Nothing is queued before this passes."""
    if request.fault not in channel.faults:
        raise HTTPException(422, str(unknown_choice("fault", request.fault, channel.faults)))
    if request.via == "kmsg" and not (
        request.fault.startswith("xid") or request.fault == "gpu-lost"
    ):
        raise HTTPException(
            422,
            f"the kernel-log path writes XID lines only (xid<N>, gpu-lost), not {request.fault}; "
            "use --via agent for it",
        )
    if request.node not in tokens.node_tokens:
        raise HTTPException(404, str(unknown_choice("node", request.node, tokens.nodes())))
    if not channel.broker.connected(request.node):
        raise HTTPException(
            409,
            f"the agent for node {request.node} has not polled in the last "
            f"{channel.broker.connected_within_s:g} s; start it with `recover agent run --node "
            f"{request.node} --coordinator URL --token-file FILE --sources ...,inject`",
        )


def _inject_route(
    app: FastAPI,
    channel: AgentChannel,
    tokens: TokenTable,
    admin: Callable[..., Principal],
    only: list[Any],
) -> None:
    @app.post("/v1/inject", response_model=dict[str, Any], dependencies=[Depends(admin), *only])
    async def inject(request: InjectRequest) -> dict[str, Any]:
        check_inject(request, channel, tokens)
        args: dict[str, Any] = {"fault": request.fault, "gpu": request.gpu, "via": request.via}
        if request.via == "agent":  # decided here, so it is known before the agent answers
            args["event_id"] = f"{request.node}:injected:{secrets.token_hex(12)}"
        try:
            command = channel.broker.enqueue(request.node, "inject", args)
        except UsageError as e:
            raise HTTPException(409, str(e)) from e
        timeout = min(request.timeout_s or channel.inject_timeout_s, channel.inject_timeout_s)
        result = await channel.broker.wait_ack(command, timeout)
        if result is None:
            channel.broker.cancel(command.id)
            raise HTTPException(
                504,
                f"the agent for node {request.node} did not carry out command {command.id} "
                f"within {timeout:g} s; the command was dropped",
            )
        if result.get("error"):
            raise HTTPException(502, f"the agent for node {request.node}: {result['error']}")
        return {
            "command": command.id,
            "node": request.node,
            "fault": request.fault,
            "gpu": request.gpu,
            "via": request.via,
            "event_id": result.get("event_id", args.get("event_id")),
            "line": result.get("line"),
        }


def _decision_route(app: FastAPI, journal: Journal, caller: Callable[..., Principal]) -> None:
    @app.get(
        "/v1/events/{event_id}/decision",
        response_model=dict[str, Any],
        dependencies=[Depends(caller)],
    )
    def decision(event_id: Annotated[str, Path(max_length=128)]) -> dict[str, Any]:
        # The journal port has no lookup of one decision; history is read whole (fine for a
        # test cluster's journal; the engine's own lookup can replace it).
        for stored, decided in journal.history():
            if stored.event.id == event_id:
                return {
                    "event_id": event_id,
                    "stored": True,
                    "received": {"wall": stored.received.wall, "mono": stored.received.mono},
                    "decision": None if decided is None else decided.to_json(),
                }
        return {"event_id": event_id, "stored": False, "decision": None}
