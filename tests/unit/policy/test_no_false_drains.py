"""No false drains: a job's own crash never takes its nodes out, escalation counts episodes
(incidents) and never lines, and the new signals (NVSwitch SXids, GSP timeouts, the driver's
reset-required assertion, XIDs the catalogue does not know) get the verdicts they should."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from recovery.model import Decision, DriverAction, Verdict
from recovery.policy import ClusterView, FlappingConfig, PolicyConfig, advance_repaired, on_repaired

from .helpers import T0, Run, node

FLOOD = PolicyConfig().flood_window_s
ESC = PolicyConfig().escalation_window_s
TAKE_OUT = (Verdict.drain_reset, Verdict.replace_node)
#: What one node's agent reports when a job crashes on its GPUs (lines the agent did not
#: fold: one per GPU; XID 45 repeats as the driver cleans up every channel).
CRASH = ["xid13", "xid31", "xid13", "xid43", "xid45", "xid45", "xid45", "xid31"]


def take_outs(decisions: list[Decision]) -> list[Decision]:
    return [d for d in decisions if d.verdict in TAKE_OUT or (d.actions and d.held)]


def crash(run: Run, nodes: list[str], at: float) -> None:
    """One job crash on ``nodes``: every node's lines, interleaved, within a few seconds."""
    for i, fault in enumerate(CRASH):
        for n in nodes:
            run.send(fault, at=at + i * 0.3, node=n, accelerator=i % 8)


def test_one_job_crash_on_16_nodes_takes_none_out(make_run: Callable[..., Run]) -> None:
    nodes = [f"n{i}" for i in range(1, 17)]
    run = make_run(view=ClusterView.from_nodes([node(n) for n in nodes]))
    crash(run, nodes, at=0)
    assert take_outs(run.decisions) == []
    assert {d.verdict for d in run.decisions} <= {Verdict.restart_app, Verdict.ignore}
    # One incident per node (the crash's lines join it); none is a failure of the node.
    opened = [d for d in run.decisions if d.opens]
    assert sorted(d.node for d in opened) == sorted(nodes)
    assert all(not d.node_failure for d in opened)
    assert all(run.state.node(n).failures == () for n in nodes)


def test_the_same_job_crashing_again_and_again_never_escalates(
    make_run: Callable[..., Run],
) -> None:
    """Requeued after each crash, the job crashes the same way every 10 minutes for a day."""
    run = make_run(config=PolicyConfig(flapping=FlappingConfig(threshold=3)))
    for k in range(144):
        crash(run, ["n1", "n2"], at=k * 600.0)
    assert take_outs(run.decisions) == []
    assert all(d.escalated_from is None for d in run.decisions)
    assert run.state.node("n1").failures == ()


def test_a_job_crash_after_a_real_fault_is_not_escalated_by_it(run: Run) -> None:
    first = run.send("xid94", at=0)  # contained ECC error: restart the job, a node failure
    assert first.verdict is Verdict.restart_app
    assert first.node_failure
    d = run.send("xid13", at=FLOOD + 60)  # later, the job's own crash
    assert d.opens
    assert d.verdict is Verdict.restart_app
    assert d.escalated_from is None
    # ... and a real fault after the crash escalates from the real one only.
    again = run.send("xid94", at=2 * FLOOD + 120)
    assert again.verdict is Verdict.drain_reset
    assert again.escalated_from is Verdict.restart_app


def test_672_xid45_lines_in_three_hours_take_nothing_out(run: Run) -> None:
    """NVSentinel's users saw a repeated-XID rule turn one node's XID 45s into 672 fatal
    events. Alone, XID 45 is a consequence: every one of them is ignored."""
    for i in range(672):
        run.send("xid45", at=i * 16.0)
    assert {d.verdict for d in run.decisions} == {Verdict.ignore}
    assert all(d.incident is None for d in run.decisions)
    assert run.state.node("n1").failures == ()


def test_xid45_after_a_real_fault_joins_it(run: Run) -> None:
    down = run.send("xid79", at=0)
    follow = run.send("xid45", at=1)
    assert follow.incident == down.incident
    assert follow.actions == ()


def test_a_flood_of_lines_is_one_episode_and_never_escalates_itself(run: Run) -> None:
    """1,000 XID 94 lines over 20 minutes, reported one by one: one incident, one failure."""
    for i in range(1000):
        run.send("xid94", at=i * 1.2)
    assert sum(d.opens for d in run.decisions) == 1
    assert all(d.verdict is Verdict.restart_app for d in run.decisions)
    assert all(d.escalated_from is None for d in run.decisions)
    assert len(run.state.node("n1").failures) == 1


def test_two_episodes_escalate_and_the_lines_of_each_count_once(run: Run) -> None:
    for i in range(50):  # a burst
        run.send("xid94", at=i * 0.1)
    for i in range(50):  # another, after a quiet spell longer than the flood window
        run.send("xid94", at=FLOOD + 100 + i * 0.1)
    opened = [d for d in run.decisions if d.opens]
    assert [d.verdict for d in opened] == [Verdict.restart_app, Verdict.drain_reset]
    assert len(run.state.node("n1").failures) == 2


def test_an_agents_late_summary_of_folded_repeats_is_not_a_new_episode(run: Run) -> None:
    """An agent with a long deduplication window reports the first line at once and the
    repeats it folded much later, after the incident went quiet: still one episode."""
    first = run.send("xid94", at=0)
    summary = run.send("xid94", at=FLOOD * 2, count=499)
    assert not summary.opens
    assert summary.incident == first.incident
    assert summary.escalated_from is None
    assert len(run.state.node("n1").failures) == 1
    # A new single occurrence after that quiet spell is a new episode, and escalates.
    assert run.send("xid94", at=FLOOD * 4).verdict is Verdict.drain_reset


def test_a_summary_after_a_repair_is_news(run: Run) -> None:
    """Repeats still coming after the node was repaired mean it is still broken."""
    run.send("xid95", at=0)
    verdict = on_repaired(run.state, "n1", run.view, run.config, T0 + 60)
    run.state = advance_repaired(run.state, verdict, T0 + 60)
    late = run.send("xid95", at=90, count=40)
    assert late.opens
    assert late.verdict in TAKE_OUT


@pytest.mark.parametrize(
    ("action", "verdict"),
    [(None, Verdict.drain_reset), (DriverAction.none, Verdict.observe)],
)
def test_an_sxid_the_driver_calls_non_fatal_is_only_observed(
    run: Run, action: DriverAction | None, verdict: Verdict
) -> None:
    d = run.send("sxid24007", driver_action=action)
    assert d.verdict is verdict
    if verdict is Verdict.observe:
        assert (d.actions, d.incident) == ((), None)
        assert "non-fatal" in d.why


def test_an_always_fatal_sxid_replaces_the_node_without_waiting_for_a_save(run: Run) -> None:
    d = run.send("sxid23001")
    assert d.verdict is Verdict.replace_node
    assert [a.kind for a in d.actions] == ["down", "promote"]


def test_an_sxid_the_catalogue_does_not_know_is_observed_not_dropped(run: Run) -> None:
    d = run.send("sxid20009")
    assert d.verdict is Verdict.observe
    assert "not in the catalogue" in d.why


@pytest.mark.parametrize("fault", ["xid119", "xid120", "gpu-reset-required"])
def test_gsp_timeouts_and_reset_required_assertions_drain_and_reset(run: Run, fault: str) -> None:
    d = run.send(fault)
    assert d.verdict is Verdict.drain_reset
    assert d.actions  # acted on


def test_a_reset_required_assertion_does_not_wait_for_a_save(run: Run) -> None:
    assert [a.kind for a in run.send("gpu-reset-required").actions] == ["down", "promote"]


def test_an_unknown_xid_is_reported_as_observed(run: Run) -> None:
    d = run.send("xid171")
    assert (d.fault, d.verdict, d.actions) == ("xid171", Verdict.observe, ())
    assert run.state.node("n1").seen["xid171"] == T0  # recorded
