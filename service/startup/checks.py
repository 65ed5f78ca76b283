"""The repair check as a command: ``repair_check.command`` from the policy file, run per node
with ``{node}`` replaced, exit 0 meaning repaired."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from recovery.policy.config import RepairCheck


class CommandCheck:
    """:class:`recovery.ports.checks.RepairChecker` over a command line."""

    def __init__(self, check: RepairCheck, log: Callable[[str], None] = lambda _m: None) -> None:
        self.check = check
        self.log = log

    def passes(self, node: str) -> bool:
        argv = [part.replace("{node}", node) for part in self.check.command]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.check.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            self.log(f"repair check for {node} could not run: {e}")
            return False
        return done.returncode == 0
