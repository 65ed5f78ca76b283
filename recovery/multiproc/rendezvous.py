"""Forming the group: process 0 starts the hub on the rendezvous port, every process (0
included) connects, says hello and waits until all K have arrived."""

from __future__ import annotations

import socket
import time

from recovery.errors import GroupError, PeerLostError
from recovery.multiproc import wire
from recovery.multiproc.group import Group, OnLost
from recovery.multiproc.hub import Hub
from recovery.multiproc.topology import Topology

#: Seconds between heartbeats (each way).
HEARTBEAT_S = 1.0
#: A peer not heard from for this long is lost. Generous: a loaded machine can hold a thread
#: off the CPU for seconds, and a process death is noticed at once anyway (its socket closes).
SILENCE_S = 30.0
#: Seconds for every process to reach the rendezvous: starting a process that imports JAX on
#: a busy node takes a while, and a process that never comes is also caught by srun.
JOIN_TIMEOUT_S = 180.0


def join(
    topology: Topology,
    *,
    on_lost: OnLost | None = None,
    join_timeout_s: float = JOIN_TIMEOUT_S,
    heartbeat_s: float = HEARTBEAT_S,
    silence_s: float = SILENCE_S,
    react: bool = True,
) -> Group:
    """Form the group of ``topology``'s job: process 0 starts the hub on the rendezvous port,
    every process connects (retrying while process 0 is still starting) and waits until all
    have arrived.

    ``on_lost`` runs on the reader thread when a peer is lost (typically: record it and end
    the process; see :func:`recovery.multiproc.exit_on_loss`). ``react=False`` ignores
    losses, so that collectives block as they would without this watch (measurements only).

    Raises:
        GroupError: the port cannot be bound (process 0), process 0 cannot be reached within
            the join timeout, or the hub refused this process (the reason says why).
        PeerLostError: a process was lost during the join.
    """
    if topology.rendezvous is None:
        raise GroupError("a single process has no group to join")
    host, port = topology.rendezvous
    hub = None
    if topology.rank == 0:
        hub = Hub(
            size=topology.size,
            group_id=topology.group_id,
            port=port,
            join_timeout_s=join_timeout_s,
            heartbeat_s=heartbeat_s,
            silence_s=silence_s,
            react=react,
        )
        try:
            hub.start()
        except OSError as e:
            raise GroupError(
                f"process 0 cannot listen on port {port} ({e}); choose another port in "
                "RECOVER_RENDEZVOUS"
            ) from e
    sock = None
    try:
        sock = _connect(host, port, join_timeout_s)
        hello = {
            "op": "hello",
            "rank": topology.rank,
            "size": topology.size,
            "group": topology.group_id,
        }
        wire.send(sock, hello)
        session, framer, pending = _welcome(sock, join_timeout_s + 5.0)
    except BaseException:
        if sock is not None:
            sock.close()
        if hub is not None:
            hub.close()
        raise
    return Group(
        sock,
        topology=topology,
        session=session,
        on_lost=on_lost,
        hub=hub,
        heartbeat_s=heartbeat_s,
        silence_s=silence_s,
        react=react,
        framer=framer,
        pending=pending,
    )


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5.0)
        except OSError as e:
            if time.monotonic() > deadline:
                raise GroupError(
                    f"cannot reach process 0 at {host}:{port} within {timeout_s:g} s ({e})"
                ) from e
            time.sleep(0.05)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def _welcome(sock: socket.socket, timeout_s: float) -> tuple[str, wire.Framer, list[wire.Message]]:
    """Wait for the hub's answer to our hello: the session id, the framer and the messages
    that came after the welcome; or an error."""
    framer = wire.Framer()
    sock.settimeout(timeout_s)
    while True:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            raise GroupError(f"process 0 did not answer within {timeout_s:g} s") from None
        except OSError as e:
            raise GroupError(f"the connection to process 0 failed during the join: {e}") from e
        if not data:
            raise GroupError("process 0 closed the connection during the join")
        try:
            messages = framer.feed(data)
        except wire.WireError as e:
            raise GroupError(f"process 0 sent something unreadable during the join: {e}") from e
        for i, msg in enumerate(messages):
            if msg["op"] == "welcome":
                return str(msg["session"]), framer, messages[i + 1 :]
            if msg["op"] == "refused":
                raise GroupError(f"process 0 refused this process: {msg.get('reason')}")
            if msg["op"] == "lost":
                raise PeerLostError(msg.get("rank"), str(msg.get("reason")))
