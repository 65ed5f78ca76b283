"""What the HTTP service asks of the coordinator. The HTTP API (``service.httpapi``) owns
transport, authentication and the durable intake; the coordinator owns decisions and actions.

Every method is safe to call from the server's threads; none blocks on Slurm except where the
docstring says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from recovery.model import HealthEvent


class CoordinatorApi(Protocol):
    """The coordinator as the service sees it. JSON-ready dicts out."""

    def submit(self, events: Sequence[HealthEvent]) -> None:
        """Hand events that were just committed to the journal (new ids only) to the engine.
        Returns at once; decisions follow asynchronously."""
        ...

    def nodes(self) -> list[dict[str, Any]]:
        """One entry per node: name, Slurm state and flags, reason, whether the reason is ours
        or who holds it, spare or not, open incident id, last heartbeat age."""
        ...

    def status(self) -> dict[str, Any]:
        """Nodes, open incidents, spares, breaker, dry-run flag, versions."""
        ...

    def repaired(self, node: str) -> dict[str, Any]:
        """An operator says ``node`` is repaired: return it to the spare pool if we took it out
        and it is not flapping. Raises UsageError for an unknown node (naming the known ones)
        or one we did not take out."""
        ...

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        """Check ``node`` now and journal the verdict (blocks for the burn-in, seconds), or
        record an operator's ``force`` (a passing verdict, marked forced). Raises UsageError
        for an unknown node (naming the known ones) or one being checked or promoted now."""
        ...

    def look_at_node(self, node: str) -> dict[str, Any]:
        """The checks that only judge facts (agent, incidents, accelerators), evaluated now
        for ``node`` and not journaled: what a job supervisor asks before it puts work on a
        spare of its own job (it runs the burn-in itself), with the site's ``validation``
        policy under ``policy``. Raises UsageError for an unknown node (naming the known
        ones)."""
        ...

    def breaker(self) -> dict[str, Any]:
        """Breaker state: window, limits, nodes taken out in the window, held actions."""
        ...

    def breaker_reset(self) -> dict[str, Any]:
        """Release the held actions that are young enough and expire the rest; returns what
        was released and what expired."""
        ...
