"""The breaker in the engine: a burst beyond the limits is held and recorded as held; a reset
releases what is young enough and expires the rest; replay re-decides under another policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.coordinator.history_replay import replay_history
from recovery.policy import BreakerConfig, PolicyConfig
from recovery.ports.journal import ActionStatus
from tests.fakes.slurm import FakeSlurm

from .helpers import CATALOGUE, Rig, event

NODES = [f"n{i}" for i in range(1, 9)]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=2, hold_max_age_s=600))
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(NODES, ["s1"]), config=config)


def _downs(rig: Rig) -> list[str]:
    return [n for c in rig.slurm.updates() if c[0] == "down" for n in c[1].split(",")]


def test_a_burst_is_held_beyond_the_limit_and_reset_releases_it(rig: Rig) -> None:
    rig.send(*(event(n, "xid79") for n in NODES[:5]))
    assert sorted(_downs(rig)) == ["n1", "n2"]
    held = rig.journal.held_actions()
    assert {r.action.node for r in held} == {"n3", "n4", "n5"}
    assert rig.engine.breaker()["tripped"] is True
    assert "held" in rig.phases("n3")

    rig.clock.advance(30)
    out = rig.engine.breaker_reset()
    assert len(out["released"]) == len(held)
    assert out["expired"] == []
    assert sorted(_downs(rig)) == ["n1", "n2", "n3", "n4", "n5"]
    assert rig.journal.held_actions() == []
    assert "released" in rig.phases("n4")


def test_held_actions_older_than_the_limit_expire_instead_of_replaying(rig: Rig) -> None:
    rig.send(*(event(n, "xid79") for n in NODES[:3]))
    rig.clock.advance(601)
    rig.engine.step()  # the tick expires what is too old
    (n3,) = {i.id for i in rig.journal.incidents() if i.node == "n3"}
    statuses = {a.status for a in rig.journal.incident(n3).actions}
    assert statuses == {ActionStatus.expired}
    assert rig.engine.breaker_reset() == {"released": [], "expired": []}
    assert "n3" not in _downs(rig)


def test_the_breaker_state_survives_a_restart(rig: Rig) -> None:
    rig.send(*(event(n, "xid79") for n in NODES[:3]))
    rig.restart().step()
    assert rig.engine.breaker()["tripped"] is True
    rig.engine.breaker_reset()
    rig.restart().step()
    assert rig.engine.breaker()["tripped"] is False


def test_replay_under_the_same_policy_differs_nowhere_and_under_another_it_does(rig: Rig) -> None:
    rig.send(*(event(n, "xid79") for n in NODES[:4]))
    rig.send(event("n6", "xid94"))
    assert replay_history(rig.journal, rig.config, CATALOGUE) == []
    looser = PolicyConfig(breaker=BreakerConfig(max_nodes=10, max_fraction=1.0))
    diffs = replay_history(rig.journal, looser, CATALOGUE)
    assert {d.node for d in diffs} == {"n3", "n4"}
    assert all(d.fields == ("held",) for d in diffs)
