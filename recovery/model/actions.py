"""What the policy decides, as values. The executor applies them through the ports; the journal
records both the decision and every action's outcome.

Every action names the node it concerns and is idempotent: applying it again after it took
effect changes nothing (the ports return False), so a restarted coordinator can finish an
incident without repeating what already happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar


class Verdict(StrEnum):
    """What a fault means for its node, in rising severity."""

    ignore = "ignore"
    """Record only."""
    observe = "observe"
    """Record and show to people (an XID the catalogue does not know, an NVSwitch error the
    driver called non-fatal): worth a look, no action."""
    restart_app = "restart-app"
    """Requeue the jobs on the node; the node stays in service."""
    drain_reset = "drain-reset"
    """Drain, let the jobs save then requeue them, return the node after repair."""
    replace_node = "replace"
    """Set the node DOWN (Slurm requeues its jobs) and promote a spare in its place."""

    @property
    def rank(self) -> int:
        return list(Verdict).index(self)


@dataclass(frozen=True)
class Action:
    """Base of every action: the node it concerns. ``kind`` names it in the journal."""

    kind: ClassVar[str] = "action"
    node: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form: ``{"kind": ..., field: value, ...}``."""
        d: dict[str, Any] = {"kind": self.kind}
        d.update({k: getattr(self, k) for k in self.__dataclass_fields__})
        return d


@dataclass(frozen=True)
class TakeDown(Action):
    """Set the node DOWN with ``reason``; Slurm requeues the requeueable jobs that ran there."""

    kind: ClassVar[str] = "down"
    reason: str = ""


@dataclass(frozen=True)
class Drain(Action):
    """Set the node DRAIN with ``reason``: running jobs keep running, no new ones start."""

    kind: ClassVar[str] = "drain"
    reason: str = ""


@dataclass(frozen=True)
class SaveThenRequeue(Action):
    """Checkpoint-then-requeue: USR1 to each job's batch step on the node (training saves and
    exits 75), wait up to ``timeout_s`` seconds for the jobs to leave, then requeue the rest."""

    kind: ClassVar[str] = "save-requeue"
    timeout_s: float = 60.0


@dataclass(frozen=True)
class RequeueJobs(Action):
    """Requeue the jobs running on the node at once (no save first)."""

    kind: ClassVar[str] = "requeue"


@dataclass(frozen=True)
class PromoteSpare(Action):
    """Bring ``spare`` into service in place of ``node``.

    ``spare`` is the policy's choice from the cluster view the decision was made on (same
    topology group first, then by name), recorded with the decision; None when the pool held
    no ready spare then (and in journals older than the field). The executor promotes it
    while it is still a ready spare; otherwise the policy chooses again from the pool as it
    is, and the promotion waits while the pool is empty."""

    kind: ClassVar[str] = "promote"
    spare: str | None = None


@dataclass(frozen=True)
class ReturnToPool(Action):
    """A repaired node we took out goes back into the spare pool (drained as a spare)."""

    kind: ClassVar[str] = "retire"


ACTION_TYPES: dict[str, type[Action]] = {
    cls.kind: cls
    for cls in (TakeDown, Drain, SaveThenRequeue, RequeueJobs, PromoteSpare, ReturnToPool)
}


def action_from_json(data: dict[str, Any]) -> Action:
    """Inverse of :meth:`Action.to_json`; a field added since the record was written takes
    its default (a ``promote`` without ``spare``). Raises KeyError/TypeError for a malformed
    record."""
    fields = dict(data)
    cls = ACTION_TYPES[fields.pop("kind")]
    return cls(**fields)


@dataclass(frozen=True)
class Decision:
    """The policy's answer to one event.

    ``incident`` is the incident the event belongs to (``opens`` tells whether this event opened
    it); None when the event is ignored and joins none. ``held`` means the breaker stopped the
    actions: they are recorded as held and run only after ``recover breaker reset`` (unless
    they expire first). ``why`` says, for people, how the verdict was reached.
    """

    event_id: str
    node: str
    fault: str
    verdict: Verdict
    actions: tuple[Action, ...] = ()
    incident: str | None = None
    opens: bool = False
    held: bool = False
    why: str = ""
    escalated_from: Verdict | None = None
    policy_version: str = ""
    notes: tuple[str, ...] = field(default=())
    node_failure: bool = True
    """Whether the incident this decision opens counts as a failure of the node (for
    escalation and flapping); False for the consequences of a job's own crash."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (actions via :meth:`Action.to_json`)."""
        return {
            "event_id": self.event_id,
            "node": self.node,
            "fault": self.fault,
            "verdict": self.verdict.value,
            "actions": [a.to_json() for a in self.actions],
            "incident": self.incident,
            "opens": self.opens,
            "held": self.held,
            "why": self.why,
            "escalated_from": self.escalated_from.value if self.escalated_from else None,
            "policy_version": self.policy_version,
            "notes": list(self.notes),
            "node_failure": self.node_failure,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Decision:
        """Inverse of :meth:`to_json`."""
        return cls(
            event_id=d["event_id"],
            node=d["node"],
            fault=d["fault"],
            verdict=Verdict(d["verdict"]),
            actions=tuple(action_from_json(a) for a in d["actions"]),
            incident=d["incident"],
            opens=d["opens"],
            held=d["held"],
            why=d["why"],
            escalated_from=Verdict(d["escalated_from"]) if d["escalated_from"] else None,
            policy_version=d["policy_version"],
            notes=tuple(d["notes"]),
            node_failure=bool(d.get("node_failure", True)),  # absent in older journals
        )
