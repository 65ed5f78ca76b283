"""Repeat failures: the escalation chain, flapping, and what repairs may return."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from recovery.errors import UsageError
from recovery.model import ReturnToPool, Verdict
from recovery.policy import (
    ClusterView,
    FlappingConfig,
    PolicyConfig,
    advance_repaired,
    on_repaired,
)

from .helpers import T0, Run, node

ESC = PolicyConfig().escalation_window_s
FLOOD = PolicyConfig().flood_window_s


def repair(run: Run, at: float, name: str = "n1") -> bool:
    verdict = on_repaired(run.state, name, run.view, run.config, T0 + at)
    run.state = advance_repaired(run.state, verdict, T0 + at)
    return verdict.returned


def test_escalation_chain_restart_drain_replace(make_run: Callable[..., Run]) -> None:
    # Flapping off, so that only escalation acts.
    run = make_run(config=PolicyConfig(flapping=FlappingConfig(threshold=100)))
    first = run.send("xid94", at=0)
    assert first.verdict is Verdict.restart_app
    assert first.escalated_from is None
    second = run.send("xid94", at=FLOOD + 1)
    assert second.opens
    assert second.verdict is Verdict.drain_reset
    assert second.escalated_from is Verdict.restart_app
    assert [a.kind for a in second.actions] == ["drain", "save-requeue", "promote"]
    assert "escalated" in second.actions[0].reason  # type: ignore[attr-defined]
    assert repair(run, at=FLOOD + 100)
    third = run.send("xid94", at=FLOOD + 200)
    assert third.verdict is Verdict.replace_node
    assert third.escalated_from is Verdict.restart_app
    assert [a.kind for a in third.actions] == ["down", "promote"]
    assert repair(run, at=FLOOD + 300)
    fourth = run.send("xid94", at=FLOOD + 400)
    assert fourth.verdict is Verdict.replace_node


@pytest.mark.parametrize(("gap", "escalates"), [(ESC, True), (ESC + 0.001, False)])
def test_escalation_window_edge(run: Run, gap: float, escalates: bool) -> None:
    run.send("xid94", at=0)
    d = run.send("xid68", at=gap)
    assert d.opens
    assert d.verdict is (Verdict.drain_reset if escalates else Verdict.restart_app)
    assert (d.escalated_from is Verdict.restart_app) is escalates


def test_ignored_faults_are_not_failures(run: Run) -> None:
    for i in range(5):
        run.send("xid43", at=i)
    assert run.send("xid94", at=10).escalated_from is None
    assert len(run.state.node("n1").failures) == 1


def test_escalation_is_per_node(run: Run) -> None:
    run.send("xid94", node="n1", at=0)
    assert run.send("xid94", node="n2", at=1).verdict is Verdict.restart_app


def test_flapping_node_is_replaced_and_stays_out(make_run: Callable[..., Run]) -> None:
    config = PolicyConfig(escalation_window_s=0, flapping=FlappingConfig(threshold=3))
    run = make_run(config=config)
    run.send("xid95", at=0)
    assert repair(run, at=100)
    run.send("xid95", at=1000)
    assert repair(run, at=1100)
    third = run.send("xid95", at=2000)
    assert third.verdict is Verdict.replace_node
    assert third.escalated_from is Verdict.drain_reset
    assert any(n.startswith("flapping: 3 failures") for n in third.notes)
    refusal = on_repaired(run.state, "n1", run.view, run.config, T0 + 2100)
    assert not refusal.returned
    assert refusal.flapping
    assert refusal.actions == ()
    assert "not returned to the spare pool" in refusal.why
    assert advance_repaired(run.state, refusal, T0 + 2100) == run.state
    assert run.state.node("n1").out


def test_flapping_ends_when_failures_leave_the_window(make_run: Callable[..., Run]) -> None:
    flap = FlappingConfig(threshold=2, window_s=1000)
    run = make_run(config=PolicyConfig(escalation_window_s=0, flapping=flap))
    run.send("xid95", at=0)
    assert repair(run, at=10)
    run.send("xid95", at=500)
    assert not on_repaired(run.state, "n1", run.view, run.config, T0 + 999).returned
    assert on_repaired(run.state, "n1", run.view, run.config, T0 + 1000.001).returned


def test_repair_returns_the_node_to_the_pool(run: Run) -> None:
    d = run.send("xid79")
    verdict = on_repaired(run.state, "n1", run.view, run.config, T0 + 60)
    assert verdict.returned
    assert verdict.actions == (ReturnToPool("n1"),)
    assert verdict.incident == d.incident
    run.state = advance_repaired(run.state, verdict, T0 + 60)
    assert not run.state.node("n1").out
    assert run.state.node("n1").incident is None
    assert run.send("xid13", at=ESC * 2).opens


def test_repair_of_a_node_we_did_not_take_out_is_an_error(run: Run) -> None:
    run.send("xid13")  # restart-app: the node stays in service
    with pytest.raises(UsageError, match="n1 was not taken out by recover"):
        on_repaired(run.state, "n1", run.view, run.config, T0)


def test_repair_of_an_unknown_node_lists_the_known(run: Run) -> None:
    with pytest.raises(UsageError, match=r"Unknown node 'n9'\. Known: n1, n2, n3, n4, s1"):
        on_repaired(run.state, "n9", run.view, run.config, T0)


def test_repair_refused_when_someone_else_holds_the_node(run: Run) -> None:
    run.send("xid79")
    other = node("n1", state="DOWN", reason="slurm-operator: pod gone", reason_set_by="slurm")
    view = ClusterView.from_nodes([*run.view.nodes.values(), other])
    with pytest.raises(UsageError, match="not ours"):
        on_repaired(run.state, "n1", view, run.config, T0)
