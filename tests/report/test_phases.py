"""Per-incident phases on real run directories, checked against the raw timestamps."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.report import PHASES, Report, build_report, load_run
from tests.report.helpers import NAMES, SAMPLES, Raw


def _report(name: str) -> Report:
    return build_report(load_run(SAMPLES / name))


def _first_step_start(raw: Raw, restart: int) -> float:
    first = raw.events_of("step", restart)[0]
    return float(first["ts"] - first["step_s"])


@pytest.mark.parametrize("name", ["xid79-spare", "xid79-fallback", "xid79-empty-pool"])
def test_phases_follow_the_raw_timestamps(name: str) -> None:
    raw = Raw(SAMPLES / name)
    inc = _report(name).incidents[0]
    fault = raw.run["faults"][0]["at"]
    started = raw.events_of("started", 1)[0]["ts"]
    restored = raw.events_of("restored", 1)[0]["ts"]
    before = raw.events_of("step", 0)
    high = max(e["step"] for e in before)
    beyond = next(e for e in raw.events_of("step", 1) if e["step"] > high)

    assert list(inc.phases) == list(PHASES)
    assert inc.fault_at == fault
    expected = {
        "detection": raw.phase("decided") - fault,
        "take_out": raw.phase("node-down") - raw.phase("decided"),
        "requeue_wait": raw.phase("job-running") - raw.phase("node-down"),
        "replacement": raw.phase("spare-promoted") - fault,
        "job_restart": started - raw.phase("job-running"),
        "restore": restored - started,
        "warmup": _first_step_start(raw, 1) - restored,
        "no_progress": beyond["ts"] - before[-1]["ts"],
    }
    for phase, seconds in expected.items():
        assert inc.phases[phase] == pytest.approx(seconds, abs=1e-6), phase
    # An xid79 is no stall: no stacks are taken, so there is nothing to diagnose.
    assert inc.phases["diagnose"] is None
    assert inc.why == {"diagnose": "no stacks were taken (not a stall)"}
    assert all(v is not None and v >= 0 for k, v in inc.phases.items() if k != "diagnose")


@pytest.mark.parametrize("name", ["xid79-spare", "xid79-fallback", "xid79-empty-pool"])
def test_the_chain_of_phases_adds_up_to_fault_to_training_again(name: str) -> None:
    raw = Raw(SAMPLES / name)
    inc = _report(name).incidents[0]
    # These one-process samples' processes were ended by Slurm, so the take-out leads.
    chain = ("detection", "take_out", "requeue_wait", "job_restart", "restore", "warmup")
    assert inc.chain == chain
    total = sum(inc.phases[p] or 0.0 for p in inc.chain)
    assert total == pytest.approx(_first_step_start(raw, 1) - raw.run["faults"][0]["at"])
    assert inc.recovery_s == pytest.approx(total)


@pytest.mark.parametrize("name", ["xid79-spare", "xid79-fallback", "xid79-empty-pool"])
def test_recomputed_steps_are_those_done_before_the_restart_past_the_restored_step(
    name: str,
) -> None:
    raw = Raw(SAMPLES / name)
    inc = _report(name).incidents[0]
    high = max(e["step"] for e in raw.events_of("step", 0))
    restored = raw.events_of("restored", 1)[0]["step"]
    assert inc.high_water_step == high
    assert inc.restored_step == restored
    assert inc.steps_recomputed == high - restored
    if high == restored:
        assert inc.phases["recompute"] == 0.0
    else:
        caught = next(e for e in raw.events_of("step", 1) if e["step"] == high)["ts"]
        assert inc.phases["recompute"] == pytest.approx(caught - _first_step_start(raw, 1))


def test_a_damaged_checkpoint_shows_as_a_fallback_with_its_reason() -> None:
    raw = Raw(SAMPLES / "xid79-fallback")
    inc = _report("xid79-fallback").incidents[0]
    [fallback] = raw.events_of("fallback")
    assert [(f.step, f.reason) for f in inc.fallbacks] == [(fallback["step"], fallback["reason"])]
    assert "digest mismatch" in inc.fallbacks[0].reason
    assert (inc.high_water_step, inc.restored_step, inc.steps_recomputed) == (20, 15, 5)


def test_the_spare_and_the_node_left_down_with_our_reason() -> None:
    inc = _report("xid79-spare").incidents[0]
    assert inc.spare == "spare1"
    assert inc.taken_out_as == inc.node_left == "DOWN"
    assert inc.slurm_reason == "recover: xid79 GPU has fallen off the bus"
    assert not inc.returned_to_pool
    assert inc.steps_recomputed == 0  # the trainer saved on SIGTERM
    assert "saved step 16 on its way out" in inc.interrupted


def test_an_empty_pool_waits_for_the_repaired_node() -> None:
    raw = Raw(SAMPLES / "xid79-empty-pool")
    inc = _report("xid79-empty-pool").incidents[0]
    assert inc.spare == inc.node == "node1"
    assert inc.returned_to_pool
    assert inc.marks["returned"] == pytest.approx(raw.phase("returned-to-pool"))
    assert inc.phases["replacement"] == pytest.approx(
        raw.phase("spare-promoted") - raw.run["faults"][0]["at"]
    )
    assert any("spare pool was empty" in n for n in inc.notes)


def _no_spare_ever(tmp_path: Path) -> Path:
    """The empty-pool run cut off where nobody repairs the node: the promotion stays
    waiting and the job never starts again."""
    raw = Raw(SAMPLES / "xid79-empty-pool")
    inc = raw.incidents[0]
    cut = raw.phase("returned-to-pool")
    inc["phases"] = [p for p in inc["phases"] if p["at"]["wall"] < cut]
    inc["status"], inc["closed"] = "open", None
    inc["info"].pop("spare", None)
    inc["actions"] = [a for a in inc["actions"] if a["kind"] != "retire"]
    for a in inc["actions"]:
        if a["kind"] == "promote":
            a["status"], a["detail"] = "waiting", "no ready spare in the pool; waiting for one"
    raw.events = [e for e in raw.events if e.get("restart_count") == 0]
    raw.run["finished"] = cut + 5.0
    raw.run["final_digest"] = None
    raw.write(tmp_path / "no-spare")
    return tmp_path / "no-spare"


def test_no_spare_at_all_says_why_and_leaves_the_job_phases_empty(tmp_path: Path) -> None:
    report = build_report(load_run(_no_spare_ever(tmp_path)))
    inc = report.incidents[0]
    assert inc.phases["replacement"] is None
    assert "spare pool was empty" in inc.why["replacement"]
    assert "waiting" in inc.why["replacement"]
    for phase in ("requeue_wait", "job_restart", "restore", "warmup", "recompute", "no_progress"):
        assert inc.phases[phase] is None, phase
        assert "did not start again" in inc.why[phase]
    assert inc.phases["detection"] is not None
    assert inc.phases["take_out"] is not None
    assert not report.completed
    assert inc.recovery_s is None


def test_a_run_without_incident() -> None:
    report = _report("no-fault")
    assert report.incidents == ()
    assert report.unmatched_faults == ()
    assert report.completed
    assert report.final_step == 30
    assert report.digest_match is True
    assert report.goodput.bucket("wasted_progress_from_disruption").seconds == 0.0
    assert report.goodput.bucket("infrastructure_recovery_from_disruption").seconds == 0.0


def test_an_injected_fault_without_incident_is_reported(tmp_path: Path) -> None:
    raw = Raw(SAMPLES / "no-fault")
    raw.run["faults"] = [
        {"fault": "xid79", "node": "node2", "via": "kmsg", "at": 1.0 + raw.run["started"]}
    ]
    raw.write(tmp_path / "missed")
    report = build_report(load_run(tmp_path / "missed"))
    assert [(f.fault, f.node) for f in report.unmatched_faults] == [("xid79", "node2")]


def test_without_an_injection_the_fault_time_is_the_agents_observation(tmp_path: Path) -> None:
    raw = Raw(SAMPLES / "xid79-spare")
    raw.run["faults"] = []
    raw.write(tmp_path / "observed")
    inc = build_report(load_run(tmp_path / "observed")).incidents[0]
    assert inc.fault_at == raw.phase("fault")
    assert "observed by the agent" in inc.fault_source


@pytest.mark.parametrize("name", NAMES)
def test_the_incident_phase_keys_are_exactly_the_documented_ones(name: str) -> None:
    for inc in _report(name).incidents:
        assert tuple(inc.phases) == PHASES
        assert set(inc.why) <= {k for k, v in inc.phases.items() if v is None}
