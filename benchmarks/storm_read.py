"""The storm benchmark's inputs and readings (:mod:`benchmarks.storm_rig` drives them): the
events sent as each node's agent would send them, slurmctld's log read for DOWN stamps, the
coordinator's incidents read for its own stamps, and the check that no healthy node changed.
Everything but :func:`send_events` is a pure function of text or records, tested on literal
input in ``tests/coordinator/test_storm.py``.
"""

from __future__ import annotations

import asyncio
import math
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agents.follow import append_fault_line, format_fault_line
from agents.inject import simulated_bus, simulated_buses
from agents.kmsg import parse_line, to_event
from recovery.ports.clock import SystemClock
from recovery.ports.journal import PhaseName
from recovery.ports.slurm import JobInfo, NodeInfo, is_ours

#: An scontrol that logs when it was called (Unix seconds) and its arguments, one call a line,
#: then runs the real one.
SHIM = """#!/bin/sh
printf '%s %s\\n' "$(date +%s.%N)" "$*" >> "{log}"
exec "{real}" "$@"
"""
#: GPUs per simulated node (the agents run with ``--simulated-gpus 8``).
GPUS = 8
#: slurmctld's log line for a node it set DOWN, at the default ``LogTimeFormat`` (seen on 22.05;
#: 25.11.7's src/slurmctld/node_mgr.c writes the same line).
_DOWN = re.compile(r"^\[([0-9T:.-]+)\] update_node: node (\S+) state set to DOWN\s*$")
#: Any change slurmctld logs for a node at our request.
_UPDATE = re.compile(r"^\[[0-9T:.-]+\] update_node: node (\S+) ")


# --- numbers ---------------------------------------------------------------------------------


def summary(values: Iterable[float]) -> dict[str, Any]:
    """count, p50, p99 and max of ``values`` (seconds); None for each when there are none.
    p99 is the nearest-rank value (of 150, the 149th)."""
    v = sorted(values)
    if not v:
        return {"count": 0, "p50_s": None, "p99_s": None, "max_s": None}
    return {
        "count": len(v),
        "p50_s": statistics.median(v),
        "p99_s": v[min(len(v) - 1, math.ceil(0.99 * len(v)) - 1)],
        "max_s": v[-1],
    }


# --- slurmctld's log -------------------------------------------------------------------------


def log_size(path: Path) -> int:
    """Bytes in ``path`` now (0 when it does not exist): where the storm's lines begin."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def log_text(path: Path, offset: int) -> str:
    """The text of the log at ``path`` from byte ``offset`` on."""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def stamp_seconds(stamp: str) -> float:
    """A slurmctld log stamp (``2026-12-02T12:45:21.584``, local time) as Unix seconds."""
    return datetime.fromisoformat(stamp).timestamp()


def downs_in(text: str) -> dict[str, float]:
    """Node -> when slurmctld logged it set DOWN (Unix seconds; the first time), from log
    ``text``. Pure."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _DOWN.match(line)
        if m and m.group(2) not in out:
            out[m.group(2)] = stamp_seconds(m.group(1))
    return out


def updated_in(text: str) -> set[str]:
    """Every node slurmctld logged a change of at someone's request (``update_node``). Pure."""
    return {m.group(1) for m in map(_UPDATE.match, text.splitlines()) if m}


def logged_downs(path: Path, offset: int) -> dict[str, float]:
    """:func:`downs_in` of the log at ``path`` from byte ``offset`` on."""
    return downs_in(log_text(path, offset))


# --- the coordinator's records ---------------------------------------------------------------


def incident_latencies(
    incidents: Sequence[Mapping[str, Any]], nodes: Iterable[str]
) -> tuple[list[float], list[str]]:
    """Per node of ``nodes``: seconds from its event's receipt to its take-down recorded
    (the coordinator's own stamps, monotonic); and the nodes with no such pair yet. Pure."""
    by_node: dict[str, dict[str, float]] = {}
    for inc in incidents:
        at = {p["name"]: p["at"]["mono"] for p in inc["phases"]}
        if PhaseName.received in at and PhaseName.node_down in at:
            by_node[inc["node"]] = at
    out, missing = [], []
    for n in nodes:
        if n in by_node:
            out.append(by_node[n][PhaseName.node_down] - by_node[n][PhaseName.received])
        else:
            missing.append(n)
    return out, missing


def promotions(incidents: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Node -> when its incident recorded a spare promoted (wall clock), for those that
    did. Pure."""
    out = {}
    for inc in incidents:
        for p in inc["phases"]:
            if p["name"] == PhaseName.spare_promoted:
                out[inc["node"]] = p["at"]["wall"]
    return out


#: The stages of one node's take-down, in order, as :func:`stages` names them.
STAGES = (
    "fault -> event committed",
    "committed -> decided",
    "decided -> scontrol update ran",
    "update ran -> DOWN logged",
    "DOWN logged -> take-down recorded",
)


def stages(
    incidents: Sequence[Mapping[str, Any]],
    fault_at: float,
    calls: Sequence[tuple[float, str]],
    downs: Mapping[str, float],
    nodes: Iterable[str],
) -> dict[str, dict[str, Any]]:
    """Where each node's fault -> DOWN went, stage by stage (:data:`STAGES`), summarised over
    ``nodes``: the coordinator's phases (received, decided, node-down), the first DOWN update
    naming the node (the shim's stamp) and slurmctld's DOWN stamp, all wall clock. A node
    missing a stamp counts in no stage it bounds. Pure."""
    phases = {inc["node"]: {p["name"]: p["at"]["wall"] for p in inc["phases"]} for inc in incidents}
    sent: dict[str, float] = {}
    for at, call in calls:
        if "state=down" in call.lower():
            for n in nodes_of_update(call):
                sent.setdefault(n, at)
    values: dict[str, list[float]] = {s: [] for s in STAGES}
    for n in nodes:
        p = phases.get(n, {})
        chain = [
            fault_at,
            p.get(PhaseName.received),
            p.get(PhaseName.decided),
            sent.get(n),
            downs.get(n),
            p.get(PhaseName.node_down),
        ]
        for name, start, end in zip(STAGES, chain, chain[1:], strict=False):
            if start is not None and end is not None:
                values[name].append(end - start)
    return {name: summary(v) for name, v in values.items()}


def update_calls(shim_log: Path) -> list[tuple[float, str]]:
    """Every ``scontrol update`` the coordinator ran, in order: when it started (Unix
    seconds) and its arguments (from the shim's log)."""
    if not shim_log.exists():
        return []
    out = []
    for line in shim_log.read_text().splitlines():
        at, _, args = line.partition(" ")
        if args.startswith("update"):
            out.append((float(at), args))
    return out


def nodes_of_update(call: str) -> list[str]:
    """The nodes one logged ``update NodeName=a,b State=...`` call names. Pure."""
    for word in call.split():
        if word.lower().startswith("nodename="):
            return word.split("=", 1)[1].split(",")
    return []


# --- what changed ----------------------------------------------------------------------------


def _looks(n: NodeInfo) -> tuple[str, frozenset[str], str]:
    return (n.state, n.flags, n.reason)


def healthy_changes(
    before: Mapping[str, NodeInfo],
    after: Mapping[str, NodeInfo],
    jobs_before: Mapping[str, Sequence[JobInfo]],
    jobs_after: Mapping[str, Sequence[JobInfo]],
    faulted: set[str],
    fault: str,
    log_text: str,
    calls: Sequence[tuple[float, str]],
    spares: set[str],
) -> list[str]:
    """Everything wrong after a storm, one line each (empty: all well). Pure.

    A healthy compute node (neither faulted nor a spare) must look the same (state, flags,
    reason), keep the same running job, and be named by no update: not in slurmctld's log
    (``log_text``: the log since the storm began), not in the coordinator's ``calls``. A
    faulted node must be DOWN with our reason naming ``fault``. Spares may change (promoted).
    """
    problems = []
    named = updated_in(log_text) | {n for _, c in calls for n in nodes_of_update(c)}
    for name, was in sorted(before.items()):
        now = after.get(name)
        if name in faulted:
            if now is None or not now.down or not is_ours(now.reason) or fault not in now.reason:
                got = "missing" if now is None else f"{now.state} reason {now.reason!r}"
                problems.append(f"{name} (faulted): not DOWN with our {fault} reason: {got}")
            continue
        if name in spares:
            continue
        if now is None or _looks(now) != _looks(was):
            got = "missing" if now is None else f"{_looks(now)}"
            problems.append(f"{name} (healthy) changed: {_looks(was)} -> {got}")
        ids_was = sorted(j.job_id for j in jobs_before.get(name, ()))
        ids_now = sorted(j.job_id for j in jobs_after.get(name, ()))
        if ids_was != ids_now:
            problems.append(f"{name} (healthy): running jobs {ids_was} -> {ids_now}")
        if name in named:
            problems.append(f"{name} (healthy) was named in an update")
    return problems


# --- sending ---------------------------------------------------------------------------------


def agent_body(node: str, fault: str, gpu: int, observed_at: float) -> bytes:
    """The ``POST /v1/events`` body ``node``'s agent sends on reading a kernel line of
    ``fault`` on GPU ``gpu``: the line made and parsed the way the agent's kernel-log path
    does it, one event in a batch (as :meth:`agents.link.Link.post_events` sends)."""
    line = f"[{time.monotonic():12.6f}] {format_fault_line(fault, simulated_bus(gpu))}"
    parsed = parse_line(line)
    assert parsed is not None, line
    event = to_event(
        parsed, node=node, boot_id="storm", observed_at=observed_at, buses=simulated_buses(GPUS)
    )
    return ('{"events":[' + event.model_dump_json() + "]}").encode()


async def send_events(
    url: str,
    posted: Sequence[str],
    tokens: Mapping[str, str],
    *,
    kmsg: Mapping[str, Path],
    fault: str,
) -> tuple[float, dict[str, tuple[int, float]]]:
    """Fail every node at one instant: write a kernel line of ``fault`` into the kernel log
    of each node in ``kmsg`` (its real agent reads it), and POST one event per node of
    ``posted`` with that node's token, each on its own keep-alive connection (opened before,
    as a running agent's is). Returns the fault's wall time and, per POSTed node, the status
    code and the wall time its answer had been read."""
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    conns = await asyncio.gather(*(asyncio.open_connection(host, port) for _ in posted))
    fault_at = time.time() + 0.05  # the bodies are made first, stamped with the fault's time
    requests = []
    for k, node in enumerate(posted):
        body = agent_body(node, fault, k % GPUS, fault_at)
        head = (
            f"POST /v1/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {tokens[node]}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        requests.append(head.encode() + body)
    await asyncio.sleep(max(0.0, fault_at - time.time()))
    fault_at = time.time()
    clock = SystemClock()
    for k, path in enumerate(kmsg.values()):
        append_fault_line(path, fault, simulated_bus(k % GPUS), clock=clock)
    for (_, writer), request in zip(conns, requests, strict=True):
        writer.write(request)

    async def answer(reader: asyncio.StreamReader) -> tuple[int, float]:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        return int(head[9:12]), time.time()

    try:
        got = await asyncio.gather(*(answer(r) for r, _ in conns))
    finally:
        for _, writer in conns:
            writer.close()
    return fault_at, dict(zip(posted, got, strict=True))
