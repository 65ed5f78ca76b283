"""A coordinator killed at any point and restarted on the same journal finishes the incident
and never repeats an action that already took effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.ports.journal import ActionStatus
from tests.fakes.slurm import FakeSlurm
from tests.helpers import Crash

from .helpers import Rig, event

DOWN = ("down", "n2", "recover: xid79 GPU has fallen off the bus")


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(["n1", "n2", "n3"], ["s1", "s2"]))


@pytest.mark.parametrize("killed_before", ["down", "resume"])
def test_killed_mid_incident_the_restart_finishes_it_once(rig: Rig, killed_before: str) -> None:
    rig.slurm.crash_before.add(killed_before)
    with pytest.raises(Crash):
        rig.send(event("n2", "xid79"))
    rig.restart().step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]
    assert [a.status for a in rig.incident("n2").actions] == [ActionStatus.done] * 2
    rig.restart().step()  # and once more: nothing is repeated
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]


def test_acknowledged_but_undecided_events_are_decided_after_a_restart(rig: Rig) -> None:
    rig.send(event("n2", "xid79"), step=False)  # committed (acknowledged), then killed
    rig.restart().step()
    assert rig.slurm.updates() == [DOWN, ("resume", "s1")]


def test_the_policy_state_is_rebuilt_from_the_journal(rig: Rig) -> None:
    rig.send(event("n2", "xid79"))
    rig.restart().step()
    # The node is still ours to return after a restart: the state came back from the journal.
    assert rig.engine.repaired("n2")["result"] == "returned to the spare pool"
    assert ("resume", "s2") not in rig.slurm.updates()


def test_a_crashed_node_no_agent_reported_becomes_one_incident(rig: Rig) -> None:
    rig.engine.step()
    rig.slurm.set_node("n3", state="DOWN", flags=frozenset({"NOT_RESPONDING"}),
                       reason="Not responding", reason_changed_at=1_800_000_000.0)  # fmt: skip
    rig.engine.step()
    rig.engine.step()
    inc = rig.incident("n3")
    assert (inc.fault, inc.event_ids) == ("node-unreachable", ("slurm-n3-down-1800000000",))
    assert ("resume", "s1") in rig.slurm.updates()
    rig.restart().step()
    rig.engine.step()
    assert [i.node for i in rig.journal.incidents()] == ["n3"]  # seen again: a duplicate id


def test_a_spare_promoted_just_before_the_kill_is_not_followed_by_a_second(rig: Rig) -> None:
    rig.slurm.crash_before.add("resume")
    with pytest.raises(Crash):
        rig.send(event("n2", "xid79"))
    rig.slurm.resume("s1")  # the resume took effect; the coordinator died before recording it
    rig.restart().step()
    assert [c for c in rig.slurm.updates() if c[0] == "resume"] == [("resume", "s1")]
    promote = rig.incident("n2").actions[-1]
    assert (promote.status, promote.detail) == (ActionStatus.done, "promoted s1")
