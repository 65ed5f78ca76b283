"""The processes of one job as a group: join, small collectives, and prompt news of a loss.

Every process holds one TCP connection to the hub in process 0 (:mod:`.hub`) and a reader
thread on it. When a peer dies its sockets close at once, the hub tells everyone, and each
process's ``on_lost`` runs within milliseconds, on the reader thread, even while the main
thread is blocked inside a collective of the accelerator runtime that would otherwise wait
for the dead peer until some heartbeat gives up (about 100 s for JAX's). A process that
vanishes without closing anything (its node lost power) is noticed after ``silence_s``.

A clean end is :meth:`Group.leave`, a collective: it is never mistaken for a death. Made by
:func:`recovery.multiproc.rendezvous.join`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recovery.errors import GroupError, PeerLostError
from recovery.multiproc import wire
from recovery.multiproc.hub import Hub
from recovery.multiproc.topology import Topology


@dataclass(frozen=True)
class PeerLost:
    """How this process learnt that the group is broken."""

    rank: int | None
    """The process lost (None: unknown, e.g. the hub refused us)."""
    reason: str
    at: float
    """Wall clock (Unix seconds) when this process heard of it."""
    status: int | None = None
    """The exit status the lost process failed with, when it said (see :meth:`Group.abort`);
    None for a death."""

    def error(self) -> PeerLostError:
        return PeerLostError(self.rank, self.reason)


OnLost = Callable[[PeerLost], None]


class Gathering:
    """An allgather under way (see :meth:`Group.start_allgather`)."""

    def __init__(self, group: Group, key: tuple[str, int]) -> None:
        self._group = group
        self._key = key

    def result(self, timeout_s: float | None = None) -> list[Any]:
        """Every process's value, in rank order (errors as :meth:`Group.allgather`)."""
        return self._group._wait_result(self._key, timeout_s)


class Channel:
    """A group's collectives on one channel: ``rank``, ``size``, ``session`` and
    :meth:`allgather`, which is all a part such as the checkpoint writer needs."""

    def __init__(self, group: Group, name: str) -> None:
        self.rank = group.rank
        self.size = group.size
        self.session = group.session
        self.name = name
        self._group = group

    def allgather(self, value: Any) -> list[Any]:
        return self._group.allgather(value, channel=self.name)


class Group:
    """A joined process's handle on its group; made by :func:`join`.

    Collectives must be called by every process in the same order *per channel*; different
    channels (one per thread that needs collectives) are independent of each other.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        topology: Topology,
        session: str,
        on_lost: OnLost | None,
        hub: Hub | None,
        heartbeat_s: float,
        silence_s: float,
        react: bool,
        framer: wire.Framer | None = None,
        pending: list[wire.Message] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.rank = topology.rank
        self.size = topology.size
        self.topology = topology
        self.session = session
        """Same string on every process of this launch (the hub's)."""
        self.lost: PeerLost | None = None
        self._sock = sock
        self._on_lost = on_lost
        self._hub = hub
        self._heartbeat_s = heartbeat_s
        self._silence_s = silence_s
        self._react = react
        self._wall = wall
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._seq: dict[str, int] = {}
        self._results: dict[tuple[str, int], list[Any]] = {}
        self._leaving = False
        self._farewell = False
        self._framer = framer or wire.Framer()
        self._pending = list(pending or [])
        sock.settimeout(heartbeat_s)  # the reader wakes this often to send heartbeats
        self._reader = threading.Thread(target=self._read, name="recover-group", daemon=True)
        self._reader.start()

    # --- collectives --------------------------------------------------------------------------

    def allgather(
        self, value: Any, *, channel: str = "main", timeout_s: float | None = None
    ) -> list[Any]:
        """Every process's ``value`` (plain JSON), in rank order.

        Raises:
            PeerLostError: a process was lost before all values arrived.
            GroupError: no answer within ``timeout_s`` (None: wait as long as the group lives).
        """
        return self.start_allgather(value, channel=channel).result(timeout_s)

    def start_allgather(self, value: Any, *, channel: str = "main") -> Gathering:
        """Send ``value`` now and collect the answer later (:meth:`Gathering.result`), so the
        round trip overlaps other work; the call order per channel is as for
        :meth:`allgather`.

        Raises:
            PeerLostError: a process was lost already.
        """
        with self._cond:
            self._raise_if_lost()
            seq = self._seq[channel] = self._seq.get(channel, 0) + 1
        self._send({"op": "gather", "channel": channel, "seq": seq, "value": value})
        return Gathering(self, (channel, seq))

    def _wait_result(self, key: tuple[str, int], timeout_s: float | None) -> list[Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while key not in self._results:
                self._raise_if_lost()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise GroupError(f"no answer to {key[0]} #{key[1]} within {timeout_s:g} s")
                self._cond.wait(left)
            return self._results.pop(key)

    def wait_lost(self, timeout_s: float) -> PeerLost | None:
        """Wait up to ``timeout_s`` for news of a lost peer; the loss, or None. For a caller
        whose collective failed on its own (the accelerator runtime may notice a dead peer
        too): None means the failure is this process's."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.lost is None and self._react:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self.lost

    def channel(self, name: str) -> Channel:
        """Collectives on channel ``name``, for a part that runs on its own thread."""
        return Channel(self, name)

    def barrier(self, *, channel: str = "main") -> None:
        """Return once every process got here (same errors as :meth:`allgather`)."""
        self.allgather(None, channel=channel)

    def any(self, flag: bool, *, channel: str = "main") -> bool:
        """True on every process when ``flag`` is true on any (same errors as
        :meth:`allgather`)."""
        return any(self.allgather(bool(flag), channel=channel))

    # --- ending -------------------------------------------------------------------------------

    def leave(self, timeout_s: float = 30.0) -> None:
        """End cleanly, together: every process must call it. Once called, a loss no longer
        runs ``on_lost``; it is raised here instead.

        Raises:
            PeerLostError: a peer was lost before everyone left.
        """
        with self._cond:
            self._leaving = True
            self._raise_if_lost()
        self._send({"op": "bye"})
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._farewell and self.lost is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            lost = self.lost
        self._close()
        if lost is not None:
            raise lost.error()

    def abort(self, reason: str, status: int | None = None) -> None:
        """Tell the others this process is failing with exit ``status`` (they stop as for a
        death, and learn the reason and the status), then close."""
        with self._cond:
            self._leaving = True
        with contextlib.suppress(GroupError):
            self._send({"op": "abort", "reason": reason[:2000], "status": status})
            if self._hub is not None:  # ours: let it read the abort and tell the others first
                self._hub.wait_told(2.0)
        self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._hub is not None:
            self._hub.close()

    # --- the reader thread --------------------------------------------------------------------

    def _send(self, msg: wire.Message) -> None:
        data = wire.encode(msg)
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as e:
                with self._cond:
                    self._raise_if_lost()
                raise GroupError(f"cannot reach process 0: {e}") from e

    def _raise_if_lost(self) -> None:
        if self.lost is not None:
            raise self.lost.error()

    def _read(self) -> None:
        framer = self._framer
        for msg in self._pending:  # arrived together with the welcome
            self._handle(msg)
        last_heard = last_ping = time.monotonic()
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except TimeoutError:
                data = None
            except OSError as e:
                return self._eof(f"the connection to process 0 failed ({e})")
            now = time.monotonic()
            if data == b"":
                return self._eof("the connection to process 0 closed: it died or was killed")
            if data is not None:
                last_heard = now
                try:
                    messages = framer.feed(data)
                except wire.WireError as e:
                    return self._eof(f"process 0 sent something unreadable ({e})")
                for msg in messages:
                    self._handle(msg)
            if now - last_heard > self._silence_s:
                return self._lose(0, f"nothing heard from process 0 for {now - last_heard:.1f} s")
            if now - last_ping >= self._heartbeat_s:
                last_ping = now
                # A broken connection is noticed by the read above, on the next turn.
                with contextlib.suppress(GroupError, PeerLostError):
                    self._send({"op": "ping"})

    def _eof(self, reason: str) -> None:
        with self._cond:
            farewell = self._farewell
        if not farewell:
            self._lose(0, reason)

    def _handle(self, msg: wire.Message) -> None:
        op = msg["op"]
        if op == "result":
            with self._cond:
                self._results[(str(msg["channel"]), int(msg["seq"]))] = list(msg["values"])
                self._cond.notify_all()
        elif op == "lost":
            rank, status = msg.get("rank"), msg.get("status")
            self._lose(
                rank if isinstance(rank, int) else None,
                str(msg.get("reason")),
                status if isinstance(status, int) else None,
            )
        elif op == "farewell":
            with self._cond:
                self._farewell = True
                self._cond.notify_all()
        elif op == "refused":
            self._lose(None, f"process 0 refused this process: {msg.get('reason')}")

    def _lose(self, rank: int | None, reason: str, status: int | None = None) -> None:
        if not self._react:
            return  # measurement mode: block as a job without this watch would
        with self._cond:
            if self.lost is not None:
                return
            self.lost = PeerLost(rank, reason, self._wall(), status)
            leaving = self._leaving
            self._cond.notify_all()
        if self._on_lost is not None and not leaving:
            self._on_lost(self.lost)
