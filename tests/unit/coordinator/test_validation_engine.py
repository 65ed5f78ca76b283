"""Only validated nodes take work (policy ``validation.required``), in the engine on a
FakeSlurm: a promotion waits for its spare's check, a spare that fails is held out with the
failed check as its reason and the next spare is tried, a fresh passing check lets a spare in
at once, a repaired node goes back only after passing, and an operator can vouch for one."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.policy import PolicyConfig
from recovery.pool.spares import SPARE_REASON
from recovery.pool.validate import ValidationSettings
from recovery.ports.journal import ActionStatus
from tests.fakes.slurm import FakeSlurm
from tests.unit.coordinator.helpers import FakeAgents, FakeBurnIn, Rig, event

GPUS = {"source": "simulated", "devices": 2}


def _rig(tmp_path: Path, *, required: bool = True, ok: bool = True) -> Rig:
    config = PolicyConfig(validation=ValidationSettings(required=required, max_age_s=300))
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(["n1", "n2"], ["s1", "s2"]), config=config)
    rig.agents = FakeAgents(rig.clock)
    rig.burn_in = FakeBurnIn(ok)
    rig.engine = rig.restart()
    for node in ("n1", "n2", "s1", "s2"):
        rig.agents.beat(node, GPUS)
    return rig


def _burn(rig: Rig) -> FakeBurnIn:
    assert isinstance(rig.burn_in, FakeBurnIn)
    return rig.burn_in


def _promotion(rig: Rig, node: str) -> tuple[ActionStatus, str]:
    (rec,) = [a for a in rig.incident(node).actions if a.action.kind == "promote"]
    return rec.status, rec.detail


def test_a_promotion_waits_for_its_spares_check_then_promotes_it(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "xid79"))
    status, detail = _promotion(rig, "n2")
    assert status is ActionStatus.waiting
    assert detail.startswith("s1 has no check within 300 s; checking it")
    assert "spare-checking" in rig.phases("n2")
    assert rig.slurm.node("s1").drained  # not in service before its verdict
    assert rig.engine.validator.run_once()  # the validator's thread, run here
    assert [r[0] for r in _burn(rig).runs] == ["s1"]
    rig.engine.step()
    assert rig.slurm.node("s1").in_service
    phases = rig.phases("n2")
    assert phases.index("spare-checked") < phases.index("spare-promoted")
    (checked,) = [p for p in rig.incident("n2").phases if p.name.value == "spare-checked"]
    assert checked.detail == "s1: passed in 2.5 s"


def test_a_spare_that_fails_is_held_and_the_next_one_is_tried(tmp_path: Path) -> None:
    rig = _rig(tmp_path, ok=False)
    rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "xid79"))
    assert rig.engine.validator.run_once()
    rig.engine.step()
    s1 = rig.slurm.node("s1")
    assert s1.drained
    assert s1.reason == "recover: check failed: burn-in: the product was wrong"
    phases = rig.phases("n2")
    assert "spare-rejected" in phases
    (rejected,) = [p for p in rig.incident("n2").phases if p.name.value == "spare-rejected"]
    assert rejected.detail == "s1: failed its check (burn-in: the product was wrong) in 2.5 s"
    # s2 is chosen and checked in turn; this one passes.
    _burn(rig).ok = True
    assert _promotion(rig, "n2")[0] is ActionStatus.waiting
    assert rig.engine.validator.busy("s2")
    assert rig.engine.validator.run_once()
    rig.engine.step()
    assert rig.slurm.node("s2").in_service
    checks = rig.incident("n2").info["spare_checks"]
    assert [(c["spare"], c["verdict"]) for c in checks] == [
        ("s1", "failed: burn-in"),
        ("s2", "passed"),
    ]
    assert rig.slurm.node("s1").reason.startswith("recover: check failed:")
    assert [r[0] for r in _burn(rig).runs] == ["s1", "s2"]


def test_a_fresh_passing_check_lets_the_spare_in_at_once(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    assert rig.engine.check_node("s1")["verdict"] == "passed"
    rig.clock.advance(60)
    rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "xid79"))
    assert rig.slurm.node("s1").in_service
    assert "spare-checking" not in rig.phases("n2")


def test_without_required_validation_nothing_waits(tmp_path: Path) -> None:
    rig = _rig(tmp_path, required=False)
    rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "xid79"))
    assert rig.slurm.node("s1").in_service
    assert _burn(rig).runs == []


def test_a_held_spare_whose_check_passes_goes_back_to_the_pool(tmp_path: Path) -> None:
    rig = _rig(tmp_path, ok=False)
    assert rig.engine.check_node("s1")["passed"] is False
    rig.engine.step()
    assert rig.slurm.node("s1").reason.startswith("recover: check failed: burn-in")
    _burn(rig).ok = True
    assert rig.engine.check_node("s1")["passed"] is True
    rig.engine.step()
    s1 = rig.slurm.node("s1")
    assert s1.drained
    assert s1.reason == SPARE_REASON


def test_a_spares_dead_agent_fails_it_without_a_burn_in(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.clock.advance(30)
    for node in ("n1", "n2", "s2"):  # s1's agent is silent
        rig.agents.beat(node)  # type: ignore[union-attr]
    check = rig.engine.check_node("s1")
    assert check["verdict"] == "failed: agent"
    rig.engine.step()
    assert rig.slurm.node("s1").reason.startswith("recover: check failed: agent: its agent's")
    assert _burn(rig).runs == []


def test_a_repaired_node_goes_back_only_after_passing_or_when_vouched_for(
    tmp_path: Path,
) -> None:
    rig = _rig(tmp_path, ok=False)
    rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "xid79"))
    rig.engine.validator.run_once()
    rig.engine.step()
    rig.clock.advance(7200)  # past escalation and flapping windows
    for node in ("n1", "n2", "s1", "s2"):
        rig.agents.beat(node)  # type: ignore[union-attr]
    with pytest.raises(UsageError, match=r"n2 failed its check \(burn-in: the product was wrong"):
        rig.engine.repaired("n2")
    assert rig.slurm.node("n2").down
    forced = rig.engine.check_node("n2", force="replaced the GPU baseboard")
    assert forced["verdict"] == "forced"
    assert rig.engine.repaired("n2")["result"] == "returned to the spare pool"
    assert rig.slurm.node("n2").reason == SPARE_REASON
