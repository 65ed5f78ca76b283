"""The spare pool: healthy nodes held out of service with our mark, ready to replace a bad one.

A spare is a node drained with reason :data:`SPARE_REASON` (``recover: spare``). Draining (not
DOWN) keeps its slurmd registered and answering, so a spare that stopped answering is visibly
unhealthy and never promoted.

Policy stays out of the pool: which spare to promote is the caller's choice (the default is
the first ready one by name), and what retiring a node takes is decided by the pure
:func:`retire_steps`; :class:`SparePool` only executes, through the :class:`SlurmControl` port.
"""

from __future__ import annotations

from typing import Literal

from recovery.errors import NoSpareError, ReasonNotOursError, unknown_choice
from recovery.ports.slurm import OWNER_PREFIX, NodeInfo, SlurmControl, describe_state

#: Reason carried by nodes held in the spare pool.
SPARE_REASON = f"{OWNER_PREFIX} spare"

#: One step of retiring a node: ``mark`` writes our reason over Slurm's own on a DOWN node
#: (``down``), ``resume`` clears our DOWN, ``drain`` holds the node with the spare reason.
RetireStep = Literal["mark", "resume", "drain"]


def is_spare(node: NodeInfo, reason: str = SPARE_REASON) -> bool:
    """True when ``node`` is held in the pool (drained with our spare reason)."""
    return node.drained and node.reason.strip() == reason


def is_ready_spare(node: NodeInfo, reason: str = SPARE_REASON) -> bool:
    """A spare that can be promoted now: in the pool, idle and its slurmd answering."""
    return (
        is_spare(node, reason)
        and node.state == "IDLE"
        and not node.flags & {"NOT_RESPONDING", "POWERED_DOWN", "COMPLETING"}
    )


def retire_steps(node: NodeInfo, reason: str = SPARE_REASON) -> list[RetireStep]:
    """What retiring ``node`` into the pool takes, in order; empty when it already is a spare.

    Pure. Raises ReasonNotOursError when someone else holds the node
    (:attr:`NodeInfo.held_by_other`): their mark is not ours to replace.

    Slurm has no "clear DOWN only" and draining a DOWN node leaves it DOWN+DRAIN, so a DOWN
    node is resumed first; slurmctld marks a resumed node NOT_RESPONDING until its slurmd
    answers a ping, so no job can land on it before the drain right after. We only resume our
    own DOWN, so a DOWN with Slurm's own mark (empty, or "Not responding") first gets ours.
    """
    if is_spare(node, reason):
        return []
    if node.held_by_other:
        raise ReasonNotOursError(node.name, node.reason, node.reason_set_by)
    if not node.down:
        return ["drain"]
    if node.reason_is_ours:
        return ["resume", "drain"]
    return ["mark", "resume", "drain"]


class SparePool:
    """Promote spares into service and retire repaired nodes into the pool, via the port."""

    def __init__(self, control: SlurmControl, *, reason: str = SPARE_REASON) -> None:
        self.control = control
        self.reason = reason

    def spares(self) -> list[NodeInfo]:
        """Spares ready to be promoted, sorted by name."""
        return [n for n in self.control.nodes() if is_ready_spare(n, self.reason)]

    def promote(self, name: str | None = None) -> str:
        """Bring spare ``name`` (default: the first ready one by name) into service; return
        its name.

        Raises UsageError naming the known nodes for an unknown ``name``; NoSpareError when
        ``name`` is not a ready spare, or none is ready, saying which pool members are not
        ready and how to add one. SlurmUnavailableError when slurmctld cannot be reached.
        """
        nodes = self.control.nodes()
        ready = [n.name for n in nodes if is_ready_spare(n, self.reason)]
        if name is not None and name not in {n.name for n in nodes}:
            raise unknown_choice("node", name, [n.name for n in nodes])
        if name is not None and name not in ready:
            raise NoSpareError(
                f"{name} is not a ready spare ({self._not_ready(nodes, [name])}); "
                f"ready: {', '.join(ready) or 'none'}"
            )
        if not ready:
            held = [n.name for n in nodes if is_spare(n, self.reason)]
            detail = f"; not ready: {self._not_ready(nodes, held)}" if held else ""
            raise NoSpareError(
                f"no spare left in the pool (nodes drained with reason {self.reason!r}){detail}. "
                "Retire a repaired node into the pool with `recover cluster retire NODE`."
            )
        chosen = name if name is not None else ready[0]
        self.control.resume(chosen)
        return chosen

    @staticmethod
    def _not_ready(nodes: list[NodeInfo], names: list[str]) -> str:
        by_name = {n.name: n for n in nodes}
        return ", ".join(
            f"{n} {describe_state(by_name[n])} {by_name[n].reason!r}".rstrip() for n in names
        )

    def retire(self, node: str) -> bool:
        """Take ``node`` (repaired, or no longer needed) out of service into the pool, running
        the steps :func:`retire_steps` decides.

        Returns False when it already is a spare. Raises ReasonNotOursError when someone else
        holds the node out of service (their mark is not ours to replace).
        """
        steps = retire_steps(self.control.node(node), self.reason)
        for step in steps:
            if step == "mark":
                self.control.down(node, self.reason)
            elif step == "resume":
                self.control.resume(node)
            else:
                self.control.drain(node, self.reason)
        return bool(steps)
