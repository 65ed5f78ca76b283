"""The circuit breaker: per-partition fraction, absolute cap, sliding window, reset with an age
limit, and what it never holds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from recovery.model import Verdict
from recovery.policy import (
    BreakerConfig,
    PolicyConfig,
    PolicyState,
    advance_repaired,
    breaker_reset,
    breaker_status,
    on_repaired,
    split_held,
)

from .helpers import T0, Run, cluster

WINDOW = BreakerConfig().window_s


def test_half_of_a_four_node_partition(run: Run) -> None:
    assert not run.send("xid79", node="n1").held
    assert not run.send("xid95", node="n2").held
    third = run.send("xid79", node="n3")
    assert third.held
    assert [a.kind for a in third.actions] == ["down", "promote"]
    assert "2 of 4 node(s) of partition gpu" in third.why
    assert third.opens
    assert not run.state.node("n3").out
    status = breaker_status(run.state, run.view, run.config, T0)
    assert status.tripped
    assert status.held == (third.incident,)
    assert [n for n, _ in status.taken_out] == ["n1", "n2"]
    (load,) = status.partitions
    assert (load.partition, load.size, load.limit, load.taken_out) == ("gpu", 4, 2, 2)


def test_absolute_limit(make_run: Callable[..., Run]) -> None:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=3, max_fraction=1.0))
    run = make_run(config=config, view=cluster(n=10))
    held = [run.send("xid79", node=f"n{i}", at=i).held for i in range(1, 6)]
    assert held == [False, False, False, True, True]
    assert "limit 3" in run.decisions[3].why


@pytest.mark.parametrize(("at", "held"), [(WINDOW, True), (WINDOW + 0.001, False)])
def test_sliding_window_expiry(run: Run, at: float, held: bool) -> None:
    run.send("xid79", node="n1", at=0)
    run.send("xid79", node="n2", at=0)
    assert run.send("xid79", node="n3", at=at).held is held


def test_window_slides_take_out_by_take_out(run: Run) -> None:
    run.send("xid79", node="n1", at=0)
    run.send("xid79", node="n2", at=200)
    assert not run.send("xid79", node="n3", at=WINDOW + 1).held  # n1 left the window
    status = breaker_status(run.state, run.view, run.config, T0 + WINDOW + 1)
    assert [n for n, _ in status.taken_out] == ["n2", "n3"]
    assert not status.tripped


def test_tripped_breaker_holds_until_reset(run: Run) -> None:
    run.send("xid79", node="n1", at=0)
    run.send("xid79", node="n2", at=0)
    assert run.send("xid79", node="n3", at=1).held
    # The window has long passed, but nothing applies by itself: NVSentinel's rule.
    later = run.send("xid79", node="n4", at=10 * WINDOW)
    assert later.held
    assert "breaker tripped" in later.why


def test_restart_app_and_ignore_are_never_held(run: Run) -> None:
    run.send("xid79", node="n1")
    run.send("xid79", node="n2")
    assert run.send("xid79", node="n3").held
    restart = run.send("xid13", node="n4")
    assert restart.verdict is Verdict.restart_app
    assert not restart.held
    assert not run.send("xid43", node="n4").held


def test_a_node_already_out_does_not_count_twice(run: Run) -> None:
    run.send("xid95", node="n1", at=0)
    run.send("xid95", node="n2", at=0)
    upgrade = run.send("xid79", node="n1", at=1)  # drain-reset -> replace on the same node
    assert upgrade.actions
    assert not upgrade.held
    assert len(breaker_status(run.state, run.view, run.config, T0 + 1).taken_out) == 2


def test_a_returned_node_failing_again_counts_once(run: Run) -> None:
    run.send("xid79", node="n1", at=0)
    run.send("xid79", node="n2", at=0)
    run.state = _repaired(run, "n1", 10)
    assert not run.send("xid79", node="n1", at=20).held


def test_upgrade_of_a_held_incident_is_held(run: Run) -> None:
    run.send("xid79", node="n1")
    run.send("xid79", node="n2")
    first = run.send("xid95", node="n3", at=1)
    assert first.held
    d = run.send("xid79", node="n3", at=2)
    assert d.incident == first.incident
    assert d.held


def test_reset_releases_young_holds_and_expires_old_ones(make_run: Callable[..., Run]) -> None:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=1, hold_max_age_s=600))
    run = make_run(config=config)
    run.send("xid79", node="n1", at=0)
    old = run.send("xid79", node="n2", at=10)
    young = run.send("xid79", node="n3", at=500)
    assert old.held
    assert young.held
    now = T0 + 700
    assert split_held(run.state, now, config) == ([young.incident], [old.incident])
    state = breaker_reset(run.state, now, config)
    assert state.node("n3").out
    assert state.node("n3").incident.held is False  # type: ignore[union-attr]
    assert not state.node("n2").out
    assert state.node("n2").incident is None
    status = breaker_status(state, run.view, config, now)
    assert not status.tripped
    assert status.reset_at == now
    assert status.taken_out == ()  # released holds were the operator's choice
    run.state = state
    assert not run.send("xid79", node="n4", at=701).held
    assert run.send("xid79", node="n2", at=702).held  # the cap of 1 applies again


def test_reset_without_config_uses_the_default_age(run: Run) -> None:
    run.send("xid79", node="n1")
    run.send("xid79", node="n2")
    held = run.send("xid79", node="n3")
    age = BreakerConfig().hold_max_age_s
    assert split_held(run.state, T0 + age) == ([held.incident], [])
    assert split_held(run.state, T0 + age + 0.001) == ([], [held.incident])
    assert not breaker_reset(run.state, T0 + age + 1).node("n3").out


def test_repairs_are_never_held(run: Run) -> None:
    run.send("xid79", node="n1")
    run.send("xid79", node="n2")
    assert run.send("xid79", node="n3").held
    assert on_repaired(run.state, "n1", run.view, run.config, T0 + 5).returned


def test_spares_do_not_count(run: Run) -> None:
    run.send("xid79", node="s1")
    run.send("xid79", node="n1")
    assert not run.send("xid79", node="n2").held


def test_status_to_json(run: Run) -> None:
    run.send("xid79", node="n1")
    data = breaker_status(run.state, run.view, run.config, T0 + 1).to_json()
    assert data["taken_out"] == [{"node": "n1", "at": T0}]
    assert data["partitions"] == [{"partition": "gpu", "size": 4, "limit": 2, "taken_out": 1}]
    assert (data["window_s"], data["max_nodes"], data["max_fraction"]) == (300.0, 10, 0.5)
    assert data["since"] == T0 + 1 - 300
    assert data["tripped"] is False


def test_one_node_partition_may_still_recover(make_run: Callable[..., Run]) -> None:
    assert not make_run(view=cluster(n=1, spares=0)).send("xid79").held


def _repaired(run: Run, name: str, at: float) -> PolicyState:
    verdict = on_repaired(run.state, name, run.view, run.config, T0 + at)
    return advance_repaired(run.state, verdict, T0 + at)
