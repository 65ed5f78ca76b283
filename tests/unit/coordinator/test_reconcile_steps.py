"""The reconcile tick is a list of named steps: one that raises is logged by its name and the
steps after it still run; the executor returns what it did instead of leaving attributes."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from recovery.coordinator.executor import Applied
from recovery.errors import SlurmUnavailableError
from recovery.policy import PolicyConfig, RepairCheck
from recovery.ports.journal import IncidentStatus
from tests.fakes.slurm import FakeSlurm

from .helpers import Rig, event

NODES = ["n1", "n2", "n3"]
STEPS = (
    "unreachable-nodes",
    "saves",
    "validation",
    "promotions",
    "operator-take-outs",
    "back-in-service",
    "held-expiry",
    "heartbeats",
    "repair-checks",
    "kubernetes",
    "ended-jobs",
    "held-jobs",
    "incidents",
)


class _Broken:
    """A heartbeat tracker that fails with ``error`` when asked."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def silent(self, now: float, after_s: float) -> list[str]:
        raise self.error


class _Check:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def passes(self, node: str) -> bool:
        self.asked.append(node)
        return False


def _rig(tmp_path: Path, error: Exception) -> tuple[Rig, _Check]:
    check = _Check()
    config = PolicyConfig(repair_check=RepairCheck(("check", "{node}"), interval_s=60))
    rig = Rig(
        tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), config=config,
        heartbeats=_Broken(error), checker=check,
    )  # fmt: skip
    return rig, check


def test_the_steps_run_in_this_order(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES))
    assert rig.engine.reconcile_steps == STEPS


def test_a_failing_step_is_logged_by_name_and_the_later_steps_still_run(tmp_path: Path) -> None:
    rig, check = _rig(tmp_path, RuntimeError("tracker broke"))
    job = rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n2", "xid79"))
    failures = [m for m in rig.logged if "heartbeats" in m]
    assert failures, rig.logged
    assert failures[0].startswith("reconcile step heartbeats failed:\nTraceback")
    assert "RuntimeError: tracker broke" in failures[0]
    # repair-checks and incidents come after heartbeats: they ran all the same.
    assert check.asked == ["n2"]
    rig.slurm.start_job(job, ["n1", "s1"])
    rig.engine.step()
    assert rig.incident("n2").status is IncidentStatus.closed


def test_a_transient_failure_is_one_line(tmp_path: Path) -> None:
    rig, check = _rig(tmp_path, SlurmUnavailableError("slurmctld unreachable"))
    rig.send(event("n2", "xid79"))
    failures = [m for m in rig.logged if "heartbeats" in m]
    assert failures[0] == ("reconcile step heartbeats: slurmctld unreachable; retrying next tick")
    assert "\n" not in failures[0]
    assert check.asked == ["n2"]


def test_run_pending_returns_what_it_did(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]))
    rig.slurm.run_job(["n1"])
    rig.slurm.run_job(["n2"])
    rig.engine.step()
    rig.send(event("n1", "xid94"), event("n2", "xid94"), step=False)  # requeues: singles
    rig.engine.decide_pending()
    # Giving way at once still lets the first single action run: a steady stream of events
    # cannot starve them.
    applied = rig.engine.executor.run_pending(give_way=lambda: True)
    assert applied == Applied(changed=1, cut_short=True)
    with pytest.raises(FrozenInstanceError):
        applied.changed = 1  # type: ignore[misc]
    assert rig.engine.executor.run_pending() == Applied(changed=1, cut_short=False)
    assert not hasattr(rig.engine.executor, "cut_short")
    assert not hasattr(rig.engine.executor, "deadline")
