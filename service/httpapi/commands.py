"""Commands for node agents, delivered by long poll (the agent opens no port).

An agent asks ``GET /v1/agents/{node}/commands?wait=S``; :meth:`CommandBroker.wait` answers at
once with the commands waiting for that node, or holds the request until one is enqueued or
``S`` seconds pass. The agent carries each command out and acknowledges it with a result;
:meth:`CommandBroker.wait_ack` lets the requester (``POST /v1/inject``) wait for that result.

Delivery is at least once: a delivered command stays until acknowledged and is handed out again
after ``lease_s`` (an agent that died between receiving and acknowledging gets it again after
its restart). Agents remember the command ids they carried out, so a redelivery is only
acknowledged again.

In memory only, by design: a command is worth something only while its requester waits for it
(seconds); a coordinator restart ends both. Everything runs on the server's event loop
(asyncio); nothing here is thread-safe. ``clock`` gives monotonic seconds for "connected".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

from recovery.errors import UsageError
from recovery.ports.clock import Clock

#: An agent counts as connected for this long after its last poll began or ended (seconds).
CONNECTED_WITHIN_S = 10.0
#: A delivered, unacknowledged command is handed out again after this long (seconds).
LEASE_S = 5.0
#: At most this many unacknowledged commands per node; more is refused (UsageError).
MAX_PENDING = 100
#: Longest a poll is held, whatever it asks for (seconds).
MAX_WAIT_S = 60.0


@dataclass
class Command:
    """One command for ``node``: ``kind`` (``inject``) and its ``args``."""

    id: str
    node: str
    kind: str
    args: dict[str, Any]
    delivered_at: float | None = None
    result: dict[str, Any] | None = None
    acked: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "kind": self.kind, "args": self.args}


@dataclass
class _Mailbox:
    commands: dict[str, Command] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    polling: int = 0
    last_poll: float | None = None


class CommandBroker:
    """Per-node queues of commands, long polls, acknowledgements; see the module docstring."""

    def __init__(
        self,
        clock: Clock,
        *,
        connected_within_s: float = CONNECTED_WITHIN_S,
        lease_s: float = LEASE_S,
        max_pending: int = MAX_PENDING,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self._clock = clock
        self.max_wait_s = max_wait_s
        self.connected_within_s = connected_within_s
        self._lease_s = lease_s
        self._max_pending = max_pending
        self._boxes: dict[str, _Mailbox] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(3)  # ids differ across coordinator restarts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _box(self, node: str) -> _Mailbox:
        return self._boxes.setdefault(node, _Mailbox())

    def enqueue(self, node: str, kind: str, args: dict[str, Any]) -> Command:
        """Queue a command for ``node`` and wake its waiting poll. Raises UsageError when the
        node already has :data:`MAX_PENDING` unacknowledged commands."""
        box = self._box(node)
        if len(box.commands) >= self._max_pending:
            raise UsageError(
                f"node {node} already has {len(box.commands)} unacknowledged commands; "
                "is its agent stuck?"
            )
        cmd = Command(f"c{self._prefix}-{next(self._ids)}", node, kind, dict(args))
        box.commands[cmd.id] = cmd
        box.changed.set()
        return cmd

    def cancel(self, command_id: str) -> bool:
        """Forget a command (its requester gave up); True if it was still queued."""
        return any(box.commands.pop(command_id, None) is not None for box in self._boxes.values())

    async def wait(self, node: str, wait_s: float) -> list[Command]:
        """Commands due for ``node`` (never delivered, or delivered more than ``lease_s`` ago),
        marked delivered; waits up to ``wait_s`` seconds (at most ``max_wait_s``) for one when
        there are none."""
        self._loop = asyncio.get_running_loop()
        box = self._box(node)
        box.polling += 1
        box.last_poll = self._clock.now().mono
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + min(max(0.0, wait_s), self.max_wait_s)
            while True:
                due = self._due(box)
                left = deadline - loop.time()
                if due or left <= 0 or self._closed:
                    return due
                box.changed.clear()
                # On a timeout, look again: a lease may have run out, or the poll's time is up.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(box.changed.wait(), min(left, self._lease_s))
        finally:
            box.polling -= 1
            box.last_poll = self._clock.now().mono

    def close(self) -> None:
        """End every held poll now (with no commands) and every later one at once: the server
        is shutting down, and uvicorn waits for open requests before it stops. Call it from
        any thread, before asking the server to exit."""
        self._closed = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile: nothing waits
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for box in self._boxes.values():
            box.changed.set()

    def _due(self, box: _Mailbox) -> list[Command]:
        now = self._clock.now().mono
        due = [
            c
            for c in box.commands.values()
            if c.delivered_at is None or now - c.delivered_at >= self._lease_s
        ]
        for c in due:
            c.delivered_at = now
        return due

    def ack(self, node: str, command_id: str, result: dict[str, Any]) -> bool:
        """Record that ``node``'s agent carried out ``command_id``; False when no such command
        is queued for that node (already acknowledged, cancelled, or someone else's)."""
        cmd = self._box(node).commands.pop(command_id, None)
        if cmd is None:
            return False
        cmd.result = dict(result)
        cmd.acked.set()
        return True

    async def wait_ack(self, command: Command, timeout_s: float) -> dict[str, Any] | None:
        """The agent's result for ``command``, or None when none came within ``timeout_s``."""
        try:
            await asyncio.wait_for(command.acked.wait(), timeout_s)
        except TimeoutError:
            return None
        return command.result

    def connected(self, node: str) -> bool:
        """Whether ``node``'s agent is polling now or polled within ``connected_within_s``."""
        box = self._boxes.get(node)
        if box is None or box.last_poll is None:
            return False
        if box.polling:
            return True
        return self._clock.now().mono - box.last_poll <= self.connected_within_s

    def last_poll(self, node: str) -> float | None:
        """Monotonic seconds of ``node``'s last poll (start or end), or None."""
        box = self._boxes.get(node)
        return None if box is None else box.last_poll

    def pending(self, node: str) -> int:
        """Unacknowledged commands for ``node``."""
        box = self._boxes.get(node)
        return 0 if box is None else len(box.commands)
