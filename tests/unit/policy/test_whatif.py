"""Replay of a recorded history under other settings: what would have differed."""

from __future__ import annotations

from types import MappingProxyType

from recovery.model import Decision, HealthEvent, Verdict
from recovery.policy import BreakerConfig, Catalogue, PolicyConfig, replay

from .helpers import T0, Run, cluster, event


def _history(
    run: Run, sends: list[tuple[str, str, float]]
) -> list[tuple[HealthEvent, float, Decision | None]]:
    out: list[tuple[HealthEvent, float, Decision | None]] = []
    for fault, name, at in sends:
        ev = event(fault, name)
        out.append((ev, T0 + at, run.send_event(ev, at)))
    return out


SENDS: list[tuple[str, str, float]] = [
    ("xid79", "n1", 0),
    ("xid13", "n2", 1),
    ("xid79", "n3", 2),
    ("xid95", "n4", 3),
]


def test_same_policy_replays_identically(run: Run, catalogue: Catalogue) -> None:
    history = _history(run, SENDS)
    assert replay(history, run.view, run.config, catalogue) == []


def test_override_and_breaker_changes_are_listed(run: Run, catalogue: Catalogue) -> None:
    history = _history(run, SENDS)
    assert [d.held for _, _, d in history if d] == [False, False, False, True]
    other = PolicyConfig(
        verdicts=MappingProxyType({"xid13": Verdict.ignore}),
        breaker=BreakerConfig(max_fraction=1.0),
    )
    diffs = replay(history, cluster(), other, catalogue)
    assert [(d.node, d.fields) for d in diffs] == [
        ("n2", ("verdict", "actions")),
        ("n4", ("held",)),
    ]
    assert diffs[0].summary().endswith("verdict restart-app -> ignore; actions requeue -> none")
    assert "held True -> False" in diffs[1].summary()
    assert diffs[0].at == T0 + 1


def test_replay_refolds_state_under_the_new_policy(run: Run, catalogue: Catalogue) -> None:
    # Recorded: xid94 twice within the flood window (one incident). With a 10 s flood window
    # the second opens a new, escalated incident.
    history = _history(run, [("xid94", "n1", 0), ("xid94", "n1", 100)])
    diffs = replay(
        history, run.view, PolicyConfig(flood_window_s=10, correlation_window_s=10), catalogue
    )
    assert len(diffs) == 1
    assert diffs[0].replayed.verdict is Verdict.drain_reset
    assert diffs[0].replayed.escalated_from is Verdict.restart_app
    assert diffs[0].recorded is not None
    assert diffs[0].recorded.actions == ()


def test_undecided_events_are_listed(run: Run, catalogue: Catalogue) -> None:
    ev = event("xid79")
    diffs = replay([(ev, T0, None)], run.view, run.config, catalogue)
    assert [d.fields for d in diffs] == [("decision",)]
    assert "undecided, now replace" in diffs[0].summary()
