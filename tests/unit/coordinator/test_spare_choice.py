"""The spare is part of the decision: the policy chooses it from the view the decision was made
on, the journal keeps it with the decision, the executor promotes it. A spare gone by then is
chosen again by the policy (recorded in the incident), and a restart never promotes a second
spare for one incident."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.coordinator.history_replay import replay_history
from recovery.model import Decision, PromoteSpare, TakeDown, Verdict, action_from_json
from recovery.policy import BreakerConfig, PolicyConfig, SpareTopology
from recovery.ports.journal import ActionStatus
from tests.fakes.slurm import FakeSlurm
from tests.helpers import Crash

from .helpers import CATALOGUE, Rig, event

NODES = ["n1", "n2", "n3", "n4"]
DOWN = ("down", "n2", "recover: xid79 GPU has fallen off the bus")
GONE = frozenset({"DRAIN", "NOT_RESPONDING"})  # still drained as a spare, but not answering


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(NODES, ["s1", "s2"]))


def _decided(rig: Rig, node: str) -> Decision:
    (decision,) = [d for s, d in rig.journal.history() if d and s.event.node == node]
    return decision


def _promotion(decision: Decision) -> PromoteSpare:
    (promote,) = [a for a in decision.actions if isinstance(a, PromoteSpare)]
    return promote


def _resumes(rig: Rig) -> list[str]:
    return [c[1] for c in rig.slurm.updates() if c[0] == "resume"]


def test_the_decision_names_the_spare_and_the_executor_promotes_that_one(rig: Rig) -> None:
    rig.send(event("n2", "xid79"))
    assert _decided(rig, "n2").actions == (
        TakeDown("n2", "xid79 GPU has fallen off the bus"),
        PromoteSpare("n2", "s1"),
    )
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]
    info = rig.incident("n2").info
    assert info.get("spare") == "s1"
    assert "spare_rechosen" not in info  # the decision's choice stood


def test_the_topology_group_decides_which_spare(tmp_path: Path) -> None:
    config = PolicyConfig(spares=SpareTopology(groups={"n2": "rack2", "s2": "rack2"}))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1", "s2"]), config=config)
    rig.send(event("n2", "xid79"))
    assert _promotion(_decided(rig, "n2")).spare == "s2"
    assert _resumes(rig) == ["s2"]


def test_a_storm_promises_each_spare_once(tmp_path: Path) -> None:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=100, max_fraction=1.0))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1", "s2"]), config=config)
    rig.send(*(event(n, "xid79") for n in ("n1", "n2", "n3")))
    spares = [_promotion(_decided(rig, n)).spare for n in ("n1", "n2", "n3")]
    assert spares == ["s1", "s2", None]  # the third found the pool empty
    assert sorted(_resumes(rig)) == ["s1", "s2"]
    third = rig.incident("n3")
    assert third.actions[-1].status is ActionStatus.waiting
    assert "no-spare" in rig.phases("n3")


def test_a_spare_gone_before_its_promotion_is_chosen_again_by_the_policy(rig: Rig) -> None:
    rig.engine.step()  # Slurm read once: s1 and s2 are ready spares
    rig.journal.append_events([event("n2", "xid79")], rig.clock.now())
    rig.engine.decide_pending()  # decided on that view: s1
    assert _promotion(_decided(rig, "n2")).spare == "s1"
    rig.slurm.set_node("s1", flags=GONE)  # s1 stops answering before the promotion runs
    rig.engine.step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s2")]
    inc = rig.incident("n2")
    assert inc.info.get("spare_rechosen") == "s2"
    assert inc.info.get("spare") == "s2"
    assert (inc.actions[-1].status, inc.actions[-1].detail) == (ActionStatus.done, "promoted s2")
    # The decision as recorded keeps what the policy chose then.
    assert _promotion(_decided(rig, "n2")).spare == "s1"


def test_a_noted_spare_gone_after_a_restart_is_chosen_again_never_both(rig: Rig) -> None:
    rig.slurm.crash_before.add("resume")
    with pytest.raises(Crash):
        rig.send(event("n2", "xid79"))
    assert rig.incident("n2").info.get("spare") == "s1"  # noted before the resume
    rig.slurm.set_node("s1", flags=GONE)  # and gone while the coordinator was down
    rig.restart().step()
    rig.restart().step()  # once more: nothing is repeated
    assert _resumes(rig) == ["s2"]
    inc = rig.incident("n2")
    assert (inc.info.get("spare"), inc.info.get("spare_rechosen")) == ("s2", "s2")
    assert inc.actions[-1].status is ActionStatus.done


def test_a_restart_after_the_second_choice_finishes_it_with_the_same_spare(rig: Rig) -> None:
    rig.engine.step()
    rig.journal.append_events([event("n2", "xid79")], rig.clock.now())
    rig.engine.decide_pending()
    rig.slurm.set_node("s1", flags=GONE)
    rig.slurm.crash_before.add("resume")  # killed just before promoting the second choice
    with pytest.raises(Crash):
        rig.engine.step()
    rig.slurm.set_node("s1", flags=frozenset({"DRAIN"}))  # s1 answers again: it must not matter
    rig.restart().step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s2")]
    assert rig.incident("n2").actions[-1].detail == "promoted s2"


def test_an_old_journals_promotion_without_a_spare_is_chosen_by_the_policy(rig: Rig) -> None:
    # Journals written before decisions named the spare hold {"kind": "promote", "node": ..}.
    old = action_from_json({"kind": "promote", "node": "n2"})
    assert old == PromoteSpare("n2", None)
    rig.engine.step()
    ev = event("n2", "xid79")
    rig.journal.append_events([ev], rig.clock.now())
    decision = Decision(
        event_id=ev.id, node="n2", fault="xid79", verdict=Verdict.replace_node,
        actions=(TakeDown("n2", "xid79 GPU has fallen off the bus"), old),
        incident="inc-old", opens=True,
    )  # fmt: skip
    rig.journal.record_decision(decision, rig.clock.now())
    rig.engine.recover()
    rig.engine.step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]
    assert rig.journal.incident("inc-old").info.get("spare_rechosen") == "s1"


def test_an_empty_pool_waits_and_the_policy_chooses_once_a_spare_appears(rig: Rig) -> None:
    rig.slurm.set_node("s1", flags=GONE)
    rig.slurm.set_node("s2", flags=GONE)
    rig.send(event("n2", "xid79"))
    assert _promotion(_decided(rig, "n2")).spare is None
    assert rig.incident("n2").actions[-1].status is ActionStatus.waiting
    rig.engine.step()
    assert _resumes(rig) == []
    rig.slurm.set_node("s2", flags=frozenset({"DRAIN"}))  # s2 answers again
    rig.engine.step()
    assert _resumes(rig) == ["s2"]
    assert rig.incident("n2").info.get("spare_rechosen") == "s2"


def test_a_replay_under_the_same_policy_differs_nowhere_once_the_spares_are_used(
    tmp_path: Path,
) -> None:
    config = PolicyConfig(breaker=BreakerConfig(max_nodes=100, max_fraction=1.0))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), config=config)
    rig.send(event("n1", "xid79"), event("n2", "xid79"))
    rig.engine.step()  # the layout recorded now has no spare left: s1 serves in n1's place
    assert [_promotion(_decided(rig, n)).spare for n in ("n1", "n2")] == ["s1", None]
    assert replay_history(rig.journal, config, CATALOGUE) == []
