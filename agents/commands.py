"""The agent's command channel: long-poll the coordinator for commands, carry each out once
(fault injection, :mod:`agents.inject`), acknowledge it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.inject import Injector
from agents.link import CoordinatorLink, Refused
from recovery.errors import TransientError
from recovery.retry import Backoff

Log = Callable[[str], None]
#: Command ids remembered as done (redeliveries are far younger than this many commands).
MAX_REMEMBERED = 1000


@dataclass
class CommandLoop:
    """Long-polls for commands, carries each out once, acknowledges it (again, when the
    coordinator hands out one it already did: its acknowledgement was lost)."""

    link: CoordinatorLink
    injector: Injector
    log: Log
    backoff: Backoff = field(default_factory=lambda: Backoff(2**31, initial_s=0.2, max_s=10.0))
    done: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run(self, stop: threading.Event, wait_s: float) -> None:
        failures = 0
        while not stop.is_set():
            try:
                for command in self.link.poll_commands(wait_s):
                    self.handle(command)
                failures = 0
            except Refused as e:  # a wrong token or node: say so, and ask again only rarely
                failures += 1
                if failures == 1:
                    self.log(f"agent: command channel refused: {e}; asking again every 30 s")
                stop.wait(30.0)
            except TransientError as e:
                failures += 1
                if failures == 1:
                    self.log(f"agent: command channel: {e}; retrying")
                stop.wait(self.backoff.wait_s(min(failures, 64), e))

    def handle(self, command: dict[str, Any]) -> None:
        cid = str(command.get("id"))
        result = self.done.get(cid)
        if result is None:
            if command.get("kind") == "inject":
                result = self.injector.carry_out(command)
            else:
                result = {"error": f"unknown command kind {command.get('kind')!r}; known: inject"}
            self.done[cid] = result
            while len(self.done) > MAX_REMEMBERED:  # oldest first: dicts keep insertion order
                del self.done[next(iter(self.done))]
            self.log(f"agent: command {cid} {command.get('kind')} {command.get('args')}: {result}")
        self.link.ack_command(cid, result)
