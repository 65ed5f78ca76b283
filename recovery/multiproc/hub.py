"""The rendezvous in process 0: every process of the job, 0 included, holds one TCP connection
to it for the life of the run.

What it does, on one thread:

* **join**: waits for a ``hello`` from each rank (the job's group id, its rank, the count),
  then answers all with ``welcome``; a rank missing after the join timeout makes it refuse
  everyone, naming the missing ranks;
* **collectives**: a ``gather`` from every rank on one ``(channel, seq)`` is answered to all
  with the list of values in rank order (allgather; a barrier gathers nothing);
* **loss**: a connection that closes without a ``bye`` (the process died: the kernel closes
  a dead process's sockets at once), an ``abort``, or a rank silent for ``silence_s`` (a node
  that vanished without closing anything) makes it tell every other rank ``lost``, once;
* **leave**: when every rank said ``bye`` it answers ``farewell`` and stops.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recovery.multiproc import wire


@dataclass
class _Conn:
    sock: socket.socket
    framer: wire.Framer = field(default_factory=wire.Framer)
    rank: int | None = None
    left: bool = False
    last_seen: float = 0.0


class Hub:
    """Process 0's side of the group. :meth:`start` binds and serves on a thread.

    Args:
        size: processes in the job.
        group_id: what each ``hello`` must carry (one launch of the job).
        port: TCP port to listen on, on every interface (0: any free port, see :attr:`port`).
        join_timeout_s: seconds from :meth:`start` for every rank to say ``hello``.
        heartbeat_s: seconds between the pings the hub sends each rank.
        silence_s: a rank not heard from for this long is lost.
        react: when False, losses are not announced (ranks then block as a job without
            our watch would: for measurements only).
        clock: monotonic seconds.

    Raises (from :meth:`start`):
        OSError: the port cannot be bound (in use, not allowed).
    """

    def __init__(
        self,
        *,
        size: int,
        group_id: str,
        port: int,
        join_timeout_s: float,
        heartbeat_s: float,
        silence_s: float,
        react: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.size = size
        self.group_id = group_id
        self.session = uuid.uuid4().hex[:12]
        self._port = port
        self._join_timeout_s = join_timeout_s
        self._heartbeat_s = heartbeat_s
        self._silence_s = silence_s
        self._react = react
        self._clock = clock
        self._conns: dict[socket.socket, _Conn] = {}
        self._ranks: dict[int, _Conn] = {}
        self._pending: dict[tuple[str, int], dict[int, Any]] = {}
        self._joined = False
        self._broken = False
        self._broken_msg: wire.Message = {}
        self._told = threading.Event()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._waker_r: socket.socket | None = None
        self._waker_w: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return int(self._listener.getsockname()[1])

    def start(self) -> Hub:
        self._listener = socket.create_server(("", self._port), backlog=self.size + 8)
        self._waker_r, self._waker_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._sel.register(self._waker_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="recover-hub", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving (waits up to ``timeout_s`` for the thread) and close every socket."""
        self._stop.set()
        if self._waker_w is not None:
            with contextlib.suppress(OSError):
                self._waker_w.send(b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def wait_told(self, timeout_s: float) -> bool:
        """Wait until the others have been sent news of a loss (or the hub stopped); True if
        they were. Process 0 failing on its own calls this before it closes the hub, or the
        hub could stop before it read process 0's own ``abort`` and the others would only see
        the connection close, without the reason or the status."""
        if not self._react:
            return False
        deadline = time.monotonic() + timeout_s
        while not self._told.wait(0.01):
            if self._stop.is_set() or time.monotonic() > deadline:
                return self._told.is_set()
        return True

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait until the hub stopped by itself (every rank left); True if it did."""
        return self._stop.wait(timeout_s)

    # --- the loop -----------------------------------------------------------------------------

    def _serve(self) -> None:
        join_deadline = self._clock() + self._join_timeout_s
        next_ping = self._clock() + self._heartbeat_s
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=self._heartbeat_s / 2):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._waker_r:
                        self._waker_r.recv(64)
                    else:
                        self._read(self._conns[key.fileobj])  # type: ignore[index]
                now = self._clock()
                if not self._joined and now > join_deadline:
                    self._refuse_join()
                if now >= next_ping:
                    next_ping = now + self._heartbeat_s
                    self._heartbeat(now)
        finally:
            self._stop.set()
            for conn in list(self._conns.values()):
                conn.sock.close()
            for s in (self._listener, self._waker_r, self._waker_w):
                if s is not None:
                    s.close()
            self._sel.close()

    def _accept(self) -> None:
        assert self._listener is not None
        sock, _ = self._listener.accept()
        # Reads only happen when the selector says so; the timeout bounds a send to a
        # process that stopped reading (stopped, or its node gone).
        sock.settimeout(self._silence_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock, last_seen=self._clock())
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        if conn.rank is not None and self._ranks.get(conn.rank) is conn:
            del self._ranks[conn.rank]
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
            messages = conn.framer.feed(data) if data else None
        except ConnectionResetError:  # how a killed process's socket often ends
            data, messages = b"", None
            why = "its connection closed: the process died or was killed"
        except (OSError, wire.WireError) as e:
            data, messages = b"", None
            why = f"its connection failed ({e})"
        else:
            why = "its connection closed: the process died or was killed"
        if messages is None:
            self._drop(conn)
            if conn.rank is not None and not conn.left:
                self._lost(conn.rank, why)
            self._maybe_finish()
            return
        conn.last_seen = self._clock()
        for message in messages:
            self._handle(conn, message)

    def _handle(self, conn: _Conn, msg: wire.Message) -> None:
        op = msg["op"]
        if op == "hello":
            self._hello(conn, msg)
        elif conn.rank is None:
            self._refuse(conn, "say hello first")
        elif op == "gather":
            self._gather(conn.rank, str(msg.get("channel")), int(msg.get("seq", -1)), msg)
        elif op == "bye":
            conn.left = True
            self._check_pending_after_leave(conn.rank)
            self._maybe_finish()
        elif op == "abort":
            status = msg.get("status")
            self._lost(
                conn.rank,
                f"it failed: {msg.get('reason', 'no reason given')}",
                status if isinstance(status, int) else None,
            )

    def _hello(self, conn: _Conn, msg: wire.Message) -> None:
        rank, size, group = msg.get("rank"), msg.get("size"), msg.get("group")
        if self._broken:  # a process was lost during the join: this one stops as the rest
            with contextlib.suppress(OSError):
                wire.send(conn.sock, self._broken_msg)
            return self._drop(conn)
        if group != self.group_id:
            return self._refuse(conn, f"group {group!r} is not this job's ({self.group_id!r})")
        if size != self.size or not isinstance(rank, int) or not 0 <= rank < self.size:
            return self._refuse(
                conn, f"rank {rank!r} of {size!r} does not fit a job of {self.size} processes"
            )
        if self._joined or rank in self._ranks:
            return self._refuse(conn, f"rank {rank} has joined already")
        conn.rank = rank
        self._ranks[rank] = conn
        if len(self._ranks) == self.size:
            self._joined = True
            self._broadcast({"op": "welcome", "session": self.session, "size": self.size})

    def _gather(self, rank: int, channel: str, seq: int, msg: wire.Message) -> None:
        key = (channel, seq)
        got = self._pending.setdefault(key, {})
        got[rank] = msg.get("value")
        if len(got) == self.size:
            del self._pending[key]
            values = [got[r] for r in range(self.size)]
            self._broadcast({"op": "result", "channel": channel, "seq": seq, "values": values})

    def _check_pending_after_leave(self, rank: int) -> None:
        for (channel, seq), got in self._pending.items():
            if rank not in got:
                why = f"it left while the others waited for it in {channel} #{seq}"
                return self._lost(rank, why)

    def _maybe_finish(self) -> None:
        if self._joined and all(c.left for c in self._ranks.values()):
            if len(self._ranks) == self.size:
                self._broadcast({"op": "farewell"})
            self._stop.set()

    def _refuse(self, conn: _Conn, reason: str) -> None:
        with contextlib.suppress(OSError):
            wire.send(conn.sock, {"op": "refused", "reason": reason})
        self._drop(conn)

    def _refuse_join(self) -> None:
        missing = sorted(set(range(self.size)) - set(self._ranks))
        reason = (
            f"process(es) {', '.join(map(str, missing))} of {self.size} did not join "
            f"within {self._join_timeout_s:g} s"
        )
        for conn in list(self._ranks.values()):
            self._refuse(conn, reason)
        self._stop.set()

    def _heartbeat(self, now: float) -> None:
        for rank, conn in list(self._ranks.items()):
            if not conn.left and now - conn.last_seen > self._silence_s:
                self._lost(rank, f"nothing heard from it for {now - conn.last_seen:.1f} s")
        self._broadcast({"op": "ping"})

    def _lost(self, rank: int, reason: str, status: int | None = None) -> None:
        """Tell every other rank, once; process 0's own connection last, so the others hear
        it before process 0 itself acts on it (and ends, taking this thread along)."""
        if self._broken or not self._react:
            return
        self._broken = True
        self._broken_msg = {"op": "lost", "rank": rank, "reason": reason, "status": status}
        self._broadcast(self._broken_msg, skip=rank)
        self._told.set()

    def _broadcast(self, msg: wire.Message, *, skip: int | None = None) -> None:
        data = wire.encode(msg)
        for rank in sorted(self._ranks, key=lambda r: (r == 0, r)):
            conn = self._ranks.get(rank)
            if conn is None or rank == skip:
                continue
            try:
                conn.sock.sendall(data)
            except OSError as e:
                self._drop(conn)
                if not conn.left:
                    self._lost(rank, f"it stopped taking messages ({e})")
