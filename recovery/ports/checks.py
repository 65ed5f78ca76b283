"""Health checks as a port: whether a node we took out is healthy again.

The command-line implementation (``service.startup.checks.CommandCheck``) runs the policy's
``repair_check`` command; tests pass a fake.
"""

from __future__ import annotations

from typing import Protocol


class RepairChecker(Protocol):
    """Runs the configured repair check for one node."""

    def passes(self, node: str) -> bool:
        """True when the check says ``node`` is repaired (exit 0). A check that cannot run or
        times out is False (the node stays out); it never raises."""
        ...
