"""Health checks as a port: whether a node we took out is healthy again.

The command-line implementation (``service.startup.checks.CommandCheck``) runs the policy's
``repair_check`` command; tests pass a fake.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol


class RepairChecker(Protocol):
    """Runs the configured repair check for one node."""

    def passes(self, node: str) -> bool:
        """True when the check says ``node`` is repaired (exit 0). A check that cannot run or
        times out is False (the node stays out); it never raises."""
        ...


class BurnInOutcome(NamedTuple):
    """What a node's burn-in job found: ``ok``, in words, its job id and how long it took
    (submission to end, seconds)."""

    ok: bool
    detail: str
    job_id: str = ""
    took_s: float = 0.0


class BurnIn(Protocol):
    """Runs the burn-in of a node out of service (``slurm.burnin.SlurmBurnIn``)."""

    def run(
        self,
        node: str,
        budget_s: float,
        restore_reason: str,
        expect_devices: int | None = None,
        peer: tuple[str, str] | None = None,
    ) -> BurnInOutcome:
        """Run a short real job on ``node`` within ``budget_s`` and put the node back out of
        service with ``restore_reason``; on an accelerator node each process must see
        ``expect_devices`` of them (None: any). ``peer``: a healthy node out of service (and
        its reason) that joins the job's collective from beside it and is put back the same
        way. What the node did is the outcome (never raised); SlurmUnavailableError when
        Slurm cannot be reached."""
        ...

    def cleanup(self, restore_reasons: Mapping[str, str]) -> list[str]:
        """Put back out of service every node a killed coordinator left in a burn-in (with
        its reason from ``restore_reasons``, else the spare reason); returns their names."""
        ...
