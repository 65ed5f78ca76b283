"""Events that belong together: companions (XID 48 with 63/64), followers (XID 45), floods,
XID 154's driver action, and what the policy ignores outright."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import pytest

from recovery.model import (
    Decision,
    Drain,
    DriverAction,
    PromoteSpare,
    RequeueJobs,
    SaveThenRequeue,
    Source,
    TakeDown,
    Verdict,
)
from recovery.policy import (
    Catalogue,
    ClusterView,
    PolicyConfig,
    PolicyState,
    decide,
    incident_id,
)
from recovery.ports.slurm import NodeInfo

from .helpers import T0, Run, cluster, event

# xid48 alone as restart-app, so that pairing with 63/64 is what makes it drain-reset.
SOFT_48 = PolicyConfig(verdicts=MappingProxyType({"xid48": Verdict.restart_app}))
WINDOW = PolicyConfig().correlation_window_s


def kinds(d: Decision) -> list[str]:
    return [a.kind for a in d.actions]


@pytest.mark.parametrize(("gap", "joined"), [(WINDOW, True), (WINDOW + 0.001, False)])
def test_63_after_48_joins_within_the_correlation_window(
    make_run: Callable[..., Run], gap: float, joined: bool
) -> None:
    run = make_run(config=SOFT_48)
    first = run.send("xid48", at=0)
    assert first.verdict is Verdict.restart_app
    second = run.send("xid63", at=gap)
    if joined:
        assert second.incident == first.incident
        assert not second.opens
        assert second.verdict is Verdict.drain_reset
        assert kinds(second) == ["drain", "save-requeue", "promote"]
        assert "companion of xid48" in second.why
    else:
        assert second.incident is None
        assert second.verdict is Verdict.ignore
        assert second.actions == ()


@pytest.mark.parametrize(("gap", "paired"), [(WINDOW, True), (WINDOW + 0.001, False)])
def test_48_after_64_or_63_is_drain_reset_only_within_the_window(
    make_run: Callable[..., Run], gap: float, paired: bool
) -> None:
    run = make_run(config=SOFT_48)
    assert run.send("xid63", at=0).verdict is Verdict.ignore
    d = run.send("xid48", at=gap)
    assert d.opens
    assert d.verdict is (Verdict.drain_reset if paired else Verdict.restart_app)
    assert ("with xid63" in d.why) is paired


def test_48_with_64_is_one_drain_reset_incident(run: Run) -> None:
    a = run.send("xid64", at=0)
    b = run.send("xid48", at=5)
    assert a.opens
    assert a.verdict is Verdict.drain_reset
    assert b.incident == a.incident
    assert not b.opens
    assert b.actions == ()
    inc = run.state.node("n1").incident
    assert inc is not None
    assert set(inc.faults) == {"xid64", "xid48"}


def test_xid45_alone_is_ignored(run: Run) -> None:
    d = run.send("xid45")
    assert d.verdict is Verdict.ignore
    assert d.incident is None
    assert "alone" in d.why


@pytest.mark.parametrize("companion", ["xid13", "xid79"])
def test_xid45_joins_the_open_incident(run: Run, companion: str) -> None:
    first = run.send(companion, at=0)
    d = run.send("xid45", at=1)
    assert d.incident == first.incident
    assert d.verdict is first.verdict
    assert d.actions == ()
    assert "follows its companion" in d.why


def test_xid45_after_a_quiet_restart_app_incident_is_alone(run: Run) -> None:
    run.send("xid13", at=0)
    quiet = max(run.config.flood_window_s, run.config.correlation_window_s)
    assert run.send("xid45", at=quiet).incident is not None
    assert run.send("xid45", at=2 * quiet + 0.001).incident is None


def test_xid45_on_another_node_does_not_join(run: Run) -> None:
    run.send("xid79", node="n1")
    assert run.send("xid45", node="n2").verdict is Verdict.ignore


def test_ten_thousand_xid95_events_are_one_incident(run: Run) -> None:
    decisions = [run.send("xid95", at=i * 0.01, accelerator=i % 8) for i in range(10_000)]
    assert {d.incident for d in decisions} == {decisions[0].incident}
    assert [d.opens for d in decisions].count(True) == 1
    assert sum(len(d.actions) for d in decisions) == 3
    assert run.state.node("n1").incident.events == 10_000  # type: ignore[union-attr]
    assert len(run.state.node("n1").failures) == 1


def test_an_event_with_count_is_one_incident(run: Run) -> None:
    d = run.send("xid95", count=800_000)
    assert d.opens
    assert len(d.actions) == 3
    assert any("800000 identical observations" in n for n in d.notes)
    assert run.state.node("n1").incident.events == 800_000  # type: ignore[union-attr]


@pytest.mark.parametrize(("gap", "joins"), [(300.0, True), (300.001, False)])
def test_restart_app_flood_window_edge(run: Run, gap: float, joins: bool) -> None:
    first = run.send("xid13", at=0)
    again = run.send("xid13", at=gap)
    assert (again.incident == first.incident) is joins
    assert again.opens is not joins
    assert (again.actions == ()) is joins


def test_a_flood_keeps_joining_while_it_lasts(run: Run) -> None:
    ds = [run.send("xid13", at=200 * i) for i in range(10)]
    assert len({d.incident for d in ds}) == 1
    assert kinds(ds[0]) == ["requeue"]
    assert all(d.actions == () for d in ds[1:])


def test_floods_on_distinct_nodes_are_distinct_incidents(run: Run) -> None:
    a = run.send("xid95", node="n1")
    b = run.send("xid95", node="n2")
    assert a.incident != b.incident
    assert a.opens
    assert b.opens


@pytest.mark.parametrize(
    ("action", "verdict"),
    [
        (None, Verdict.ignore),
        (DriverAction.none, Verdict.ignore),
        (DriverAction.drain_p2p, Verdict.drain_reset),
        (DriverAction.drain_and_reset, Verdict.drain_reset),
        (DriverAction.gpu_reset, Verdict.drain_reset),
        (DriverAction.node_reboot, Verdict.replace_node),
    ],
)
def test_xid154_driver_action_overrides_the_table(
    run: Run, action: DriverAction | None, verdict: Verdict
) -> None:
    d = run.send("xid154", driver_action=action)
    assert d.verdict is verdict
    if action is not None:
        assert f"driver asks for {action}" in d.why


def test_policy_file_override_wins_over_the_driver(make_run: Callable[..., Run]) -> None:
    config = PolicyConfig(verdicts=MappingProxyType({"xid154": Verdict.ignore}))
    d = make_run(config=config).send("xid154", driver_action=DriverAction.node_reboot)
    assert d.verdict is Verdict.ignore
    assert "policy file sets xid154 to ignore" in d.why


def test_worse_fault_while_out_adds_only_what_is_missing(run: Run) -> None:
    first = run.send("xid95", at=0)
    d = run.send("xid79", at=5000)
    assert d.incident == first.incident
    assert not d.opens
    assert d.verdict is Verdict.replace_node
    assert [type(a) for a in d.actions] == [TakeDown]
    assert run.state.node("n1").incident.verdict is Verdict.replace_node  # type: ignore[union-attr]


def test_milder_fault_while_out_joins_silently(run: Run) -> None:
    first = run.send("xid79", at=0)
    d = run.send("xid13", at=5000)
    assert d.incident == first.incident
    assert d.actions == ()
    assert "already out" in d.why


def test_heartbeats_are_not_incidents(run: Run) -> None:
    before = run.state
    d = run.send("heartbeat-lost", source=Source.heartbeat)
    assert d.verdict is Verdict.ignore
    assert d.incident is None
    assert run.state == before


def test_node_not_in_view_is_ignored_with_a_note(run: Run) -> None:
    d = run.send("xid79", node="ghost1")
    assert d.verdict is Verdict.ignore
    assert d.actions == ()
    assert "node ghost1 is not in the cluster view" in d.notes


def test_unknown_fault_is_ignored_with_the_known_ones(run: Run) -> None:
    d = run.send("gpu-melted")
    assert d.verdict is Verdict.ignore
    assert "Unknown fault 'gpu-melted'. Known: " in d.notes[0]


def test_unlisted_xid_is_reported_and_observed_by_default(run: Run) -> None:
    d = run.send("xid14")
    assert d.verdict is Verdict.observe
    assert (d.actions, d.incident) == ((), None)
    assert "not in the catalogue" in d.why


def test_fault_on_a_spare_only_keeps_it_out_of_the_pool(run: Run) -> None:
    d = run.send("xid79", node="s1")
    assert [type(a) for a in d.actions] == [TakeDown]
    assert not d.held
    assert run.send("xid95", node="s1", at=1).actions == ()


def test_gpu_gone_never_saves_first(make_run: Callable[..., Run]) -> None:
    config = PolicyConfig(verdicts=MappingProxyType({"gpu-lost": Verdict.drain_reset}))
    d = make_run(config=config).send("gpu-lost")
    assert d.verdict is Verdict.drain_reset
    assert [type(a) for a in d.actions] == [TakeDown, PromoteSpare]


def test_restart_app_plan_and_dry_run_note(make_run: Callable[..., Run]) -> None:
    d = make_run(config=PolicyConfig(dry_run=True)).send("xid13")
    assert d.actions == (RequeueJobs("n1"),)
    assert any(n.startswith("dry run") for n in d.notes)


def test_drain_reset_plan_is_drain_save_promote(run: Run) -> None:
    d = run.send("xid119")
    assert [type(a) for a in d.actions] == [Drain, SaveThenRequeue, PromoteSpare]


def test_incident_ids_come_from_event_ids(catalogue: Catalogue) -> None:
    ev = event("xid79", id="agent-n1-42")
    d1 = decide(PolicyState.empty(), ev, cluster(), PolicyConfig(), catalogue, T0)
    d2 = decide(PolicyState.empty(), ev, cluster(), PolicyConfig(), catalogue, T0 + 99)
    assert d1.incident == d2.incident == incident_id("agent-n1-42")
    assert d1.incident is not None
    assert d1.incident.startswith("inc-")
    assert len(d1.incident) == len("inc-") + 10
    assert incident_id("agent-n1-43") != d1.incident


def test_node_in_no_partition_is_decided(make_run: Callable[..., Run]) -> None:
    view = ClusterView.from_nodes([NodeInfo(name="n1", state="IDLE")])
    d = make_run(view=view).send("xid79")
    assert [type(a) for a in d.actions] == [TakeDown, PromoteSpare]
    assert not d.held
