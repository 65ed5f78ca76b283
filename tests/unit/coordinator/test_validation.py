"""Checking a node (``recovery.coordinator.validation.Validator``) on a FakeSlurm, a real
SQLite journal and a fake clock: the cheap checks' verdicts, the burn-in only on a node out of
service and only after the cheap checks passed, the verdict journaled with its time, forced
verdicts, and a node claimed for its burn-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recovery.coordinator.validation import NodeClaims, Validator
from recovery.errors import UsageError
from recovery.pool.spares import SPARE_REASON
from recovery.pool.validate import ValidationSettings, fresh_pass
from recovery.ports.clock import FakeClock
from service.journaldb.journal import SqliteJournal
from tests.fakes.slurm import FakeSlurm
from tests.unit.coordinator.helpers import FakeAgents, FakeBurnIn


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    class Rig:
        clock = FakeClock()
        slurm = FakeSlurm(["node1", "node2"], ["spare1", "spare2"])
        journal = SqliteJournal(tmp_path / "j.db", clock, checkpoint_every_s=None)
        agents = FakeAgents(clock)
        burn = FakeBurnIn()
        claims = NodeClaims()

        def validator(self, **settings: Any) -> Validator:
            return Validator(
                journal=self.journal, clock=self.clock, agents=self.agents, burn_in=self.burn,
                settings=ValidationSettings(**settings), claims=self.claims,
                nodes=self.slurm.nodes, log=lambda _: None,
            )  # fmt: skip

    r = Rig()
    r.burn.claims = r.claims
    return r


GPUS = {"source": "nvml", "devices": 8}


def test_a_healthy_spare_passes_every_check_and_is_put_back_with_its_reason(rig: Any) -> None:
    rig.agents.beat("spare1", GPUS)
    rig.clock.advance(3)
    check = rig.validator(accelerators=8).check("spare1")
    assert check.verdict == "passed"
    assert check.passed
    assert [r.name for r in check.results] == ["agent", "incidents", "accelerators", "burn-in"]
    assert all(r.ok for r in check.results)
    assert "heartbeat 3.0 s ago" in check.results[0].detail
    assert rig.burn.runs == [("spare1", 60.0, SPARE_REASON)]
    assert rig.burn.held_by == ["burn-in"]  # claimed while it ran, released after
    assert rig.claims.holder("spare1") is None
    assert check.took_s == 2.5


@pytest.mark.parametrize(
    ("setup", "failed", "words"),
    [
        (lambda r: None, "agent", "its agent never sent a heartbeat"),
        (lambda r: (r.agents.beat("spare1", GPUS), r.clock.advance(25)), "agent",
         "last heartbeat is 25.0 s old (at most 20 s)"),
        (lambda r: r.agents.beat("spare1", {**GPUS, "devices": 7}), "accelerators",
         "7 device(s), 8 expected"),
        (lambda r: r.agents.beat("spare1", {**GPUS, "lost": [3]}), "accelerators",
         "device(s) 3 lost"),
        (lambda r: r.agents.beat("spare1", {**GPUS, "remap_failed": [1, 2]}), "accelerators",
         "device(s) 1, 2 with a failed row remap"),
        (lambda r: r.agents.beat("spare1", {**GPUS, "retirement_pending": [0]}),
         "accelerators", "device(s) 0 with a page retirement pending"),
        (lambda r: r.agents.beat("spare1", {**GPUS, "faults": 1, "last_fault": "xid79",
                                            "last_fault_at": 1.0}),
         "accelerators", "an accelerator fault since its agent started (xid79)"),
        (lambda r: r.agents.beat("spare1", None), "accelerators",
         "its agent reported no accelerators (8 expected)"),
    ],
)  # fmt: skip
def test_a_failed_cheap_check_is_named_and_no_burn_in_follows(
    rig: Any, setup: Any, failed: str, words: str
) -> None:
    setup(rig)
    check = rig.validator(accelerators=8).check("spare1")
    assert not check.passed
    assert check.verdict == f"failed: {failed}"
    assert check.failed is not None
    assert words in check.failed.detail
    assert rig.burn.runs == []
    assert check.results[-1].ok is None
    assert "a cheaper check failed" in check.results[-1].detail
    assert check.hold_reason().startswith(f"recover: check failed: {failed}: ")


def test_a_fault_before_the_previous_check_does_not_fail_the_next(rig: Any) -> None:
    rig.agents.beat("spare1", {**GPUS, "faults": 1, "last_fault": "xid79", "last_fault_at": 1.0})
    v = rig.validator()
    v.force("spare1", "GPU 3 reseated")
    rig.clock.advance(10)
    rig.agents.beat("spare1")
    assert v.check("spare1").passed
    rig.agents.reported["spare1"]["last_fault_at"] = rig.clock.now().wall + 1  # a new one
    rig.clock.advance(2)
    rig.agents.beat("spare1")
    assert v.check("spare1").verdict == "failed: accelerators"


def test_an_open_incident_fails_the_check(rig: Any) -> None:
    from recovery.model import Decision, Verdict
    from tests.unit.coordinator.helpers import event

    rig.agents.beat("node1", GPUS)
    ev = event("node1")
    rig.journal.append_events([ev], rig.clock.now())
    decision = Decision(event_id=ev.id, node="node1", fault="xid79", verdict=Verdict.drain_reset,
                        incident="inc-1", opens=True, why="test")  # fmt: skip
    rig.journal.record_decision(decision, rig.clock.now())
    check = rig.validator().check("node1")
    assert check.verdict == "failed: incidents"
    assert "inc-1" in check.results[1].detail


def test_an_in_service_node_is_not_burned_in(rig: Any) -> None:
    rig.agents.beat("node1", GPUS)
    check = rig.validator().check("node1")
    assert check.passed
    assert check.results[-1].ok is None
    assert "in service" in check.results[-1].detail
    assert rig.burn.runs == []


def test_a_failed_burn_in_fails_the_check_and_the_verdict_is_kept_with_its_history(
    rig: Any,
) -> None:
    v = rig.validator()
    rig.agents.beat("spare1", GPUS)
    assert v.check("spare1").passed
    first = v.last("spare1")
    assert first is not None
    rig.burn.ok = False
    rig.clock.advance(60)
    rig.agents.beat("spare1")
    check = v.check("spare1")
    assert check.verdict == "failed: burn-in"
    assert "the product was wrong" in check.hold_reason()
    kept = v.last("spare1")
    assert kept == check
    assert v.history("spare1") == [{"at": first.at, "verdict": "passed"}]
    assert not fresh_pass(kept, rig.clock.now().wall, 600)
    assert fresh_pass(first, first.at + 600, 600)
    assert not fresh_pass(first, first.at + 601, 600)


def test_no_burn_in_when_asked_not_to_and_a_busy_node_is_not_burned_in(rig: Any) -> None:
    rig.agents.beat("spare1", GPUS)
    v = rig.validator()
    check = v.check("spare1", burn_in=False)
    assert check.passed
    assert "not asked for" in check.results[-1].detail
    assert rig.claims.claim("spare1", "promotion") is None
    with pytest.raises(UsageError, match=r"spare1 is busy \(promotion\)"):
        v.check("spare1")
    assert rig.burn.runs == []


def test_forcing_needs_a_reason_and_is_journaled_as_forced(rig: Any) -> None:
    v = rig.validator()
    with pytest.raises(UsageError, match="operator's reason"):
        v.force("spare1", " ")
    forced = v.force("spare1", "swapped the board")
    assert forced.passed
    assert forced.verdict == "forced"
    assert v.last("spare1") == forced


def test_an_unknown_node_is_named_with_the_known_ones(rig: Any) -> None:
    with pytest.raises(UsageError, match="node1, node2, spare1, spare2"):
        rig.validator().check("spare9")


def test_status_rows_show_each_nodes_last_verdict(rig: Any) -> None:
    v = rig.validator()
    rig.agents.beat("spare1", GPUS)
    v.check("spare1")
    rig.clock.advance(30)
    rows = {r["node"]: r for r in v.rows(rig.slurm.nodes())}
    assert rows["spare1"]["verdict"] == "passed"
    assert rows["spare1"]["age_s"] == 30.0
    assert rows["spare1"]["spare"] is True
    assert rows["spare2"]["verdict"] is None
    assert rows["node1"]["spare"] is False


@pytest.mark.parametrize(
    "bad", [{"max_age_s": 0}, {"burn_in_budget_s": -1}, {"recheck_s": -1}, {"accelerators": -2}]
)
def test_settings_refuse_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="validation"):
        ValidationSettings(**bad)  # type: ignore[arg-type]


def test_a_fault_before_the_repair_is_what_was_repaired(rig: Any) -> None:
    v = rig.validator()
    at = rig.clock.now().wall
    rig.agents.beat("spare1", {**GPUS, "faults": 1, "last_fault": "xid79", "last_fault_at": at})
    assert v.check("spare1", burn_in=False).verdict == "failed: accelerators"
    rig.clock.advance(5)
    v.note_repaired("spare1", rig.clock.now().wall)
    assert v.repaired_at("spare1") == rig.clock.now().wall
    rig.agents.beat("spare1")
    assert v.check("spare1", burn_in=False).passed
    rig.agents.reported["spare1"]["last_fault_at"] = rig.clock.now().wall + 1
    rig.clock.advance(2)
    rig.agents.beat("spare1")
    failed = v.check("spare1", burn_in=False)
    assert failed.failed is not None
    assert "an accelerator fault since its last check (xid79)" in failed.failed.detail


def test_background_rechecks_are_cheap_until_the_burn_in_would_grow_stale(rig: Any) -> None:
    v = rig.validator(recheck_s=60, max_age_s=600, required=True)
    rig.agents.beat("spare1", GPUS)
    rig.agents.beat("spare2", GPUS)
    assert v.run_once()
    assert v.run_once()
    assert [r[0] for r in rig.burn.runs] == ["spare1", "spare2"]
    burned = v.last("spare1").burned_at
    assert burned == rig.clock.now().wall
    assert not v.run_once()  # nothing due yet
    for _ in range(8):  # every 60 s, cheap: the spares stay in the pool
        rig.clock.advance(60)
        rig.agents.beat("spare1")
        rig.agents.beat("spare2")
        assert v.run_once()
        assert v.run_once()
        last = v.last("spare1")
        assert last.passed
        assert last.burned_at == burned  # carried over
        assert v.fresh("spare1")
    assert len(rig.burn.runs) == 2
    rig.clock.advance(60)  # 540 s since the burn-in: the next would find it older than 600
    rig.agents.beat("spare1")
    rig.agents.beat("spare2")
    assert v.run_once()
    assert [r[0] for r in rig.burn.runs] == ["spare1", "spare2", "spare1"]
    assert v.last("spare1").burned_at == rig.clock.now().wall


def test_a_fresh_check_needs_a_fresh_burn_in_where_the_policy_has_them(rig: Any) -> None:
    v = rig.validator(max_age_s=600, required=True)
    rig.agents.beat("spare1", GPUS)
    cheap = v.check("spare1", burn_in=False)
    assert cheap.passed
    assert cheap.burned_at is None
    assert not v.fresh("spare1")  # passed, but never burned in
    wait, asked = v.gate("spare1", "inc-1")
    assert wait is not None
    assert asked
    v.force("spare1", "vouched")
    assert v.fresh("spare1")  # the operator's word stands for the burn-in
    assert fresh_pass(cheap, cheap.at, 600)
    assert not fresh_pass(cheap, cheap.at, 600, burned=True)


def test_a_look_judges_the_facts_now_and_journals_nothing(rig: Any) -> None:
    """What a job supervisor asks about a spare of its own job: the cheap checks only (it
    burns the node in itself), never journaled, never counted as the node's last check."""
    v = rig.validator(accelerators=8)
    rig.agents.beat("node2", GPUS)
    rig.clock.advance(2)
    seen = v.look("node2")
    assert seen.passed
    assert [r.name for r in seen.results] == ["agent", "incidents", "accelerators"]
    assert v.last("node2") is None
    assert v.history("node2") == []
    assert rig.burn.runs == []
    rig.clock.advance(30)  # its agent went silent
    dead = v.look("node2")
    assert dead.verdict == "failed: agent"
    assert "32.0 s old" in dead.results[0].detail
    assert v.last("node2") is None
    with pytest.raises(UsageError, match=r"node9.*node1"):
        v.look("node9")


def test_the_burn_in_takes_a_healthy_spare_as_its_peer_when_there_is_one(rig: Any) -> None:
    """The collective runs with a peer: a spare whose check and burn-in passed within
    max_age_s, claimed while the burn-in runs (so it is not promoted under it). With no such
    spare the collective runs within the node, and the verdict says so."""
    v = rig.validator()
    rig.agents.beat("spare1")
    rig.agents.beat("spare2")
    first = v.check("spare2")
    assert first.passed
    assert rig.burn.peers == [None]  # spare1 was never checked: no peer
    assert "the collective ran within the node" in first.results[-1].detail
    second = v.check("spare1")
    assert second.passed
    assert rig.burn.peers[-1] == ("spare2", SPARE_REASON)
    assert rig.burn.peer_held_by == ["burn-in peer of spare1"]
    assert rig.claims.holder("spare2") is None  # released after
    assert "within the node" not in second.results[-1].detail
    rig.clock.advance(601)  # both burn-ins are stale now: no peer qualifies
    rig.agents.beat("spare1")
    rig.agents.beat("spare2")
    v.check("spare1")
    assert rig.burn.peers[-1] is None
