"""The spares' checks a promotion waited on, as the report tells them: which failed and why,
what they cost (the promotion's wait), and what promoting the bad one would have cost instead.

The sample ``bad-spare`` is a real run of the shipped scenario: see samples/README.md."""

from __future__ import annotations

from pathlib import Path

from recovery.report import build_report, load_run
from recovery.report.runbook import render_markdown
from tests.report.helpers import copy_sample


def test_the_checks_their_cost_and_a_bad_promotions_cost_are_told(tmp_path: Path) -> None:
    report = build_report(load_run(copy_sample("bad-spare", tmp_path)))
    (inc,) = report.incidents
    assert [(c["spare"], c["verdict"]) for c in inc.spare_checks] == [
        ("spare1", "failed: agent"),
        ("spare2", "passed"),
    ]
    assert inc.spare == "spare2"
    assert inc.check_wait_s is not None
    assert 0 < inc.check_wait_s < inc.phases["replacement"]  # type: ignore[operator]
    (note,) = [n for n in inc.notes if n.startswith("the spares were checked")]
    assert "spare1 failed: agent in 0.0 s (its agent's last heartbeat is" in note
    assert f"the promotion waited {inc.check_wait_s:.1f} s for the checks" in note
    assert inc.recovery_s is not None
    assert f"about {inc.recovery_s:.1f} s from fault to training again" in note
    # The agent killed on purpose opens no incident and is not reported as missed.
    assert report.unmatched_faults == ()
    text = render_markdown(report)
    assert "Spare `spare1` failed its check and is held out" in text
    assert "Spare `spare2` now runs the job; 0 spare(s) left in the pool" in text


def test_the_job_supervisors_checks_on_the_way_to_its_relaunch_are_told(tmp_path: Path) -> None:
    """The in-allocation twin (sample ``bad-job-spare``): the job's own spare node6 lost its
    agent after its background burn-in; the relaunch's cheap re-check rejected it and took
    node1. Only the checks on the relaunch's path count (not the background burn-ins); the
    coordinator's check of the pool spare it promoted for the lost node comes first."""
    report = build_report(load_run(copy_sample("bad-job-spare", tmp_path)))
    (inc,) = report.incidents
    assert [(c["spare"], c["verdict"]) for c in inc.spare_checks] == [
        ("spare1", "passed"),
        ("node6", "failed: agent"),
        ("node1", "passed"),
    ]
    (note,) = [n for n in inc.notes if n.startswith("the job's supervisor checked")]
    assert "node6 failed: agent in 0.1 s (its agent's last heartbeat is 10.5 s old" in note
    assert "the relaunch waited 0.6 s for the checks" in note
    assert inc.relaunch_check_wait_s is not None
    assert 0.5 < inc.relaunch_check_wait_s < 0.7
    assert inc.recovery_s is not None
    assert (
        "Relaunching on node6 unchecked would have cost another recovery like this one "
        f"(about {inc.recovery_s:.1f} s from fault to training again)"
    ) in note
    assert report.unmatched_faults == ()
    assert "Spare `node6` failed its check and is held out" in render_markdown(report)
