"""Replay: what a different policy (settings or catalogue) would have decided on a recorded
history. Pure; the state is rebuilt from the replayed decisions as it goes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from recovery.model import Action, Decision, HealthEvent, PromoteSpare
from recovery.policy.catalogue import Catalogue
from recovery.policy.config import PolicyConfig
from recovery.policy.decide import decide
from recovery.policy.state import ClusterView, PolicyState, advance


@dataclass(frozen=True)
class ReplayDifference:
    """One event decided differently: ``fields`` names what differs (``verdict``,
    ``actions``, ``held``; ``decision`` when none was recorded). ``at`` is the recorded
    receipt time (Unix seconds)."""

    event_id: str
    node: str
    fault: str
    at: float
    fields: tuple[str, ...]
    recorded: Decision | None
    replayed: Decision

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "event_id": self.event_id,
            "node": self.node,
            "fault": self.fault,
            "at": self.at,
            "fields": list(self.fields),
            "recorded": self.recorded.to_json() if self.recorded else None,
            "replayed": self.replayed.to_json(),
        }

    def summary(self) -> str:
        """One line for people."""
        if self.recorded is None:
            return (
                f"{self.event_id} {self.node} {self.fault}: undecided, now {self.replayed.verdict}"
            )
        parts = []
        if "verdict" in self.fields:
            parts.append(f"verdict {self.recorded.verdict} -> {self.replayed.verdict}")
        if "actions" in self.fields:
            before = ",".join(a.kind for a in self.recorded.actions) or "none"
            after = ",".join(a.kind for a in self.replayed.actions) or "none"
            parts.append(f"actions {before} -> {after}")
        if "held" in self.fields:
            parts.append(f"held {self.recorded.held} -> {self.replayed.held}")
        return f"{self.event_id} {self.node} {self.fault}: " + "; ".join(parts)


def replay(
    history: Sequence[tuple[HealthEvent, float, Decision | None]],
    view: ClusterView,
    config: PolicyConfig,
    catalogue: Catalogue,
) -> list[ReplayDifference]:
    """Re-decide each ``(event, received_at, recorded)`` of ``history`` in order, at its
    recorded time, under ``config`` and ``catalogue``; list the events whose verdict, actions
    or held flag would have differed. Events without a recorded decision are listed too."""
    state = PolicyState.empty()
    out: list[ReplayDifference] = []
    for event, at, recorded in history:
        now = decide(state, event, view, config, catalogue, at)
        state = advance(state, event, now, at)
        fields = differences(recorded, now)
        if fields:
            out.append(
                ReplayDifference(event.id, event.node, event.fault, at, fields, recorded, now)
            )
    return out


def differences(recorded: Decision | None, replayed: Decision) -> tuple[str, ...]:
    """What differs between a recorded and a replayed decision (``verdict``, ``actions``,
    ``held``), or ``("decision",)`` when none was recorded.

    Which spare a promotion names is not compared: it depends on the pool at the moment of
    the decision, which a replay (against one layout for the whole history) cannot see."""
    if recorded is None:
        return ("decision",)
    names = []
    if recorded.verdict is not replayed.verdict:
        names.append("verdict")
    if _plan(recorded.actions) != _plan(replayed.actions):
        names.append("actions")
    if recorded.held != replayed.held:
        names.append("held")
    return tuple(names)


def _plan(actions: Sequence[Action]) -> tuple[Action, ...]:
    """``actions`` without the spares their promotions chose."""
    return tuple(replace(a, spare=None) if isinstance(a, PromoteSpare) else a for a in actions)
