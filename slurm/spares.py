"""The spare pool: healthy nodes held out of service with our mark, ready to replace a bad one.

A spare is a node drained with reason :data:`slurm.conf.SPARE_REASON` (``recover: spare``).
Draining (not DOWN) keeps its slurmd registered and answering, so a spare that stopped
answering is visibly unhealthy and never promoted.
"""

from __future__ import annotations

from recovery.errors import NoSpareError, ReasonNotOursError
from recovery.ports.slurm import NodeInfo, SlurmControl
from slurm.conf import SPARE_REASON


def is_spare(node: NodeInfo, reason: str = SPARE_REASON) -> bool:
    """True when ``node`` is held in the pool (drained with our spare reason)."""
    return node.drained and node.reason == reason


def is_ready_spare(node: NodeInfo, reason: str = SPARE_REASON) -> bool:
    """A spare that can be promoted now: in the pool, idle and its slurmd answering."""
    return (
        is_spare(node, reason)
        and node.state == "IDLE"
        and not node.flags & {"NOT_RESPONDING", "POWERED_DOWN", "COMPLETING"}
    )


class SparePool:
    """Promote spares into service and retire repaired nodes into the pool, via the port."""

    def __init__(self, control: SlurmControl, *, reason: str = SPARE_REASON) -> None:
        self.control = control
        self.reason = reason

    def spares(self) -> list[NodeInfo]:
        """Spares ready to be promoted, sorted by name."""
        return [n for n in self.control.nodes() if is_ready_spare(n, self.reason)]

    def promote(self) -> str:
        """Bring the first ready spare (by name) into service; return its name.

        Raises NoSpareError when none is ready, saying which pool members are not ready and
        how to add one. SlurmUnavailableError when slurmctld cannot be reached.
        """
        nodes = self.control.nodes()
        ready = [n for n in nodes if is_ready_spare(n, self.reason)]
        if not ready:
            held = [n for n in nodes if is_spare(n, self.reason)]
            detail = (
                "; not ready: "
                + ", ".join(f"{n.name} ({n.state}+{'+'.join(sorted(n.flags))})" for n in held)
                if held
                else ""
            )
            raise NoSpareError(
                f"no spare left in the pool (nodes drained with reason {self.reason!r}){detail}. "
                "Retire a repaired node into the pool with `recover cluster retire NODE`."
            )
        name = ready[0].name
        self.control.resume(name)
        return name

    def retire(self, node: str) -> bool:
        """Take ``node`` (repaired, or no longer needed) out of service into the pool.

        Returns False when it already is a spare. Raises ReasonNotOursError when someone else
        holds the node out of service (their mark is not ours to replace).
        """
        info = self.control.node(node)
        if is_spare(info, self.reason):
            return False
        if (info.down or info.drained) and info.reason and not info.reason_is_ours:
            raise ReasonNotOursError(info.name, info.reason, info.reason_set_by)
        if info.down:
            # Draining a DOWN node leaves it DOWN+DRAIN, and Slurm has no "clear DOWN only".
            # Resume first: slurmctld marks a resumed node NOT_RESPONDING until its slurmd
            # answers a ping, so no job can land on it before the drain right after.
            self.control.resume(node)
        return self.control.drain(node, self.reason)
