"""Slurm's truth over the journal: a node we took out that someone returned to service
(``scontrol update state=resume`` after a quick reboot, a cluster started anew on the same
state directory) is no longer held out by its incident, so a new fault there is acted on and
counted, never folded into the old incident as a repeat or as "already out"."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.coordinator.reconcile import BACK_AFTER_S
from tests.fakes.slurm import FakeSlurm
from tests.unit.coordinator.helpers import Rig, event

NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.sqlite", FakeSlurm(NODES, ["s1", "s2"]))


def _back_for(rig: Rig, seconds: float) -> None:
    """Ticks of the engine over ``seconds`` of the fake clock."""
    for _ in range(int(seconds / 0.5) + 1):
        rig.clock.advance(0.5)
        rig.engine.step()


def test_a_node_resumed_by_hand_is_let_go_and_its_next_fault_acted_on(rig: Rig) -> None:
    rig.send(event("n2", "xid79"))
    first = rig.incident("n2")
    assert rig.slurm.node("n2").down
    rig.slurm.scontrol_resume("n2")  # the operator, by hand, after a quick reboot
    _back_for(rig, BACK_AFTER_S + 1)
    assert "back-in-service" in rig.phases("n2")
    detail = next(p.detail for p in rig.incident("n2").phases if p.name == "back-in-service")
    assert "n2 is in service again (IDLE) without recover returning it" in detail
    # 40 s after the first: within the flood window (300 s), yet a new incident that acts.
    rig.clock.advance(40)
    rig.send(event("n2", "xid79"))
    second = rig.incident("n2")
    assert second.id != first.id
    assert rig.slurm.node("n2").down
    decision = rig.journal.history()[-1][1]
    assert decision is not None
    assert "joins incident" not in decision.why
    assert "escalat" in decision.why or "flapping" in decision.why  # it counted


def test_a_node_still_going_out_is_not_taken_for_returned(rig: Rig) -> None:
    """Between our decision and Slurm showing the node out (a take-out refused once, a
    snapshot read just before it landed) the node looks in service: not a return."""
    rig.engine.step()
    rig.slurm.unavailable = 2  # slurmctld busy: the take-out's first tick fails
    rig.send(event("n2", "xid79"), step=False)
    rig.engine.decide_pending()
    rig.engine.executor.run_pending()
    assert rig.incident("n2").actions[0].attempts == 1
    _back_for(rig, 2 * BACK_AFTER_S)
    assert "back-in-service" not in rig.phases("n2")
    assert rig.slurm.node("n2").down


def test_a_node_out_by_our_hand_stays_held(rig: Rig) -> None:
    rig.send(event("n2", "xid79"))
    _back_for(rig, 2 * BACK_AFTER_S)
    assert "back-in-service" not in rig.phases("n2")
    rig.clock.advance(10)
    rig.send(event("n2", "xid79"))  # the same fault again while out: it joins
    assert len([i for i in rig.journal.incidents() if i.node == "n2"]) == 1
