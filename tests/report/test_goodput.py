"""Goodput and badput over real runs: every second of wall time in exactly one bucket."""

from __future__ import annotations

import itertools

import pytest

from recovery.report import BADPUT, build_report, load_run
from recovery.report.goodput import spans
from recovery.report.processes import split_processes
from tests.report.helpers import NAMES, SAMPLES, Raw


@pytest.mark.parametrize("name", NAMES)
def test_goodput_and_badput_sum_to_the_wall_time(name: str) -> None:
    raw = Raw(SAMPLES / name)
    g = build_report(load_run(SAMPLES / name)).goodput
    wall = raw.run["finished"] - raw.run["started"]
    assert g.wall_s == pytest.approx(wall)
    assert [b.name for b in g.badput] == list(BADPUT)
    assert g.productive_s + sum(b.seconds for b in g.badput) == pytest.approx(wall, abs=1e-6)
    assert g.goodput + sum(b.share for b in g.badput) == pytest.approx(1.0)
    assert all(b.seconds >= 0 for b in g.badput)
    assert 0 < g.goodput < 1


@pytest.mark.parametrize("name", NAMES)
def test_the_spans_cover_the_run_without_overlap(name: str) -> None:
    run = load_run(SAMPLES / name)
    cut = spans(split_processes(run.events), run.started, run.finished)
    assert cut[0][0] == run.started
    assert cut[-1][1] == run.finished
    for (_, end, _), (begin, _, _) in itertools.pairwise(cut):
        assert end == begin


def test_wasted_progress_is_the_first_run_of_the_steps_done_again() -> None:
    raw = Raw(SAMPLES / "xid79-fallback")
    g = build_report(load_run(SAMPLES / "xid79-fallback")).goodput
    restored = raw.events_of("restored", 1)[0]["step"]  # 15: step 20 failed verification
    at = {e["step"]: e["ts"] for e in raw.events_of("step", 0)}
    blocked = next(e["blocked_s"] for e in raw.events_of("checkpoint", 0) if e["step"] == restored)
    # Steps 16..20 of the first process, less the save of step 15 that blocked step 16.
    expected = at[max(at)] - at[restored] - blocked
    assert g.bucket("wasted_progress_from_disruption").seconds == pytest.approx(expected)


@pytest.mark.parametrize("name", ["xid79-spare", "xid79-fallback", "xid79-empty-pool"])
def test_infrastructure_recovery_runs_from_the_old_process_to_the_new(name: str) -> None:
    raw = Raw(SAMPLES / name)
    g = build_report(load_run(SAMPLES / name)).goodput
    old_end = max(e["ts"] for e in raw.events if e["restart_count"] == 0)
    new_start = raw.events_of("started", 1)[0]["ts"]
    assert g.bucket("infrastructure_recovery_from_disruption").seconds == pytest.approx(
        new_start - old_end
    )


def test_restore_is_the_trainers_own_measure() -> None:
    raw = Raw(SAMPLES / "xid79-fallback")
    g = build_report(load_run(SAMPLES / "xid79-fallback")).goodput
    restore_s = raw.events_of("restored", 1)[0]["restore_s"]
    assert g.bucket("checkpoint_restore").seconds == pytest.approx(restore_s)


def test_nothing_is_wasted_when_the_trainer_saved_on_its_way_out() -> None:
    g = build_report(load_run(SAMPLES / "xid79-spare")).goodput
    assert g.bucket("wasted_progress_from_disruption").seconds == 0.0
    assert g.bucket("infrastructure_recovery_from_disruption").seconds > 10  # cred_expire
