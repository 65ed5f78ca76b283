"""Expectations against an outcome (pure): each check says what was expected, what happened
and by how much it missed; lost progress is counted from the job's own events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recovery.model import Verdict
from recovery.report import PHASES as REPORT_PHASES
from recovery.report import build_report, load_run
from recovery.report.phases import PHASES
from scenarios.expect import Check, OperatorAnswer, Outcome, Progress, check, progress
from scenarios.reporting import IncidentCost, ReportSummary, summarize
from scenarios.schema import Expectations

DIGEST = "ab" * 16
SAMPLES = Path(__file__).parents[1] / "report" / "samples"


def _events(*spec: tuple[str, int | None]) -> list[dict[str, Any]]:
    """Event records as a loop writes them, one second apart."""
    return [{"event": kind, "ts": float(t), "step": step} for t, (kind, step) in enumerate(spec)]


#: Three processes: the second resumes from step 2 after reaching 3 (fell back from a damaged
#: 4), the third starts over from 0 after reaching 4. With and without the optional warmup.
RESTARTS = (
    ("started", None), ("warmup", 0), ("step", 1), ("step", 2), ("step", 3), ("checkpoint", 2),
    ("started", None), ("fallback", 4), ("restored", 2), ("warmup", 2), ("step", 3), ("step", 4),
    ("started", None), ("warmup", 0), ("step", 1),
)  # fmt: skip
NO_WARMUP = tuple(e for e in RESTARTS if e[0] != "warmup")


def _incident(iid: str, verdict: str, *phases: str) -> dict[str, Any]:
    return {
        "id": iid,
        "verdict": verdict,
        "status": "closed",
        "phases": [
            {"name": p, "at": {"wall": float(i)}, "detail": ""} for i, p in enumerate(phases)
        ],
    }


def _outcome(**changes: Any) -> Outcome:
    base: dict[str, Any] = {
        "job_state": "COMPLETED",
        "final_digest": DIGEST,
        "control_digest": DIGEST,
        "progress": Progress(0, 0, ()),
        "incidents": [_incident("inc-1", "replace", "fault", "node-down", "closed")],
    }
    return Outcome(**{**base, **changes})


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_progress_counts_each_restart_from_the_step_it_resumed() -> None:
    p = progress(_events(*RESTARTS))
    # 3 -> resumed at 2: 1 step; then furthest 4 -> restarted at 0: 4 steps.
    assert (p.steps_recomputed, p.fallbacks, p.restored_steps) == (5, 1, (2,))
    assert progress(_events(("started", None), ("warmup", 0), ("step", 1))) == Progress(0, 0, ())


def test_a_loop_without_warmup_events_counts_the_same_and_fails_the_expectation() -> None:
    assert progress(_events(*NO_WARMUP)) == progress(_events(*RESTARTS))
    for spec in (NO_WARMUP, RESTARTS):
        out = _outcome(progress=progress(_events(*spec)))
        got = _by_name(check(Expectations(max_steps_recomputed=4), out))
        assert got["max_steps_recomputed"] == Check(
            "max_steps_recomputed", False, "5 steps recomputed, at most 4 allowed (1 over)"
        )


def test_a_malformed_event_log_fails_the_lost_progress_checks_with_the_reason() -> None:
    p = progress([*_events(("started", None), ("step", 1)), {"event": "step", "ts": 2.0}])
    assert p.error == (
        "the job's events.jsonl record 3: a 'step' event needs field 'step' (an integer)"
    )
    got = _by_name(check(Expectations(max_steps_recomputed=4, min_fallbacks=0),
                         _outcome(progress=p)))  # fmt: skip
    for name in ("max_steps_recomputed", "min_fallbacks"):
        assert got[name] == Check(name, False, f"not counted: {p.error}")


def test_a_run_that_did_what_was_expected_passes_every_check() -> None:
    expect = Expectations(
        max_steps_recomputed=4, incidents=1, verdicts=[Verdict.replace_node],
        incident_phases=["node-down"], out_of_service=["node2"], in_service=["spare1"],
    )  # fmt: skip
    out = _outcome(node_states={"node2": "out", "spare1": "in-service"},
                   progress=Progress(3, 0, (8,)))  # fmt: skip
    checks = check(expect, out)
    assert [c.name for c in checks] == [
        "completes", "digest_matches_control", "max_steps_recomputed", "incidents", "verdicts",
        "incident_phases node-down", "out_of_service node2", "in_service spare1",
    ]  # fmt: skip
    assert all(c.ok for c in checks), checks


def test_failures_say_what_was_expected_and_by_how_much() -> None:
    expect = Expectations(
        max_steps_recomputed=4, min_fallbacks=2, incidents=1, verdicts=[Verdict.drain_reset],
        incident_phases=["no-spare"], held=1, out_of_service=["node2"],
    )  # fmt: skip
    out = _outcome(
        job_state="FAILED", final_digest=None, progress=Progress(6, 1, (4,)),
        incidents=[_incident("inc-1", "replace", "node-down"), _incident("inc-2", "replace")],
        node_states={"node2": "spare"},
        operator=[OperatorAnswer("repaired node2", "refused", "accepted", "returned")],
    )  # fmt: skip
    got = _by_name(check(expect, out))
    assert {k for k, c in got.items() if c.ok is not False} == set()
    assert got["completes"].detail == "the job ended FAILED"
    assert got["digest_matches_control"].detail == "no final digest: the job did not complete"
    assert got["max_steps_recomputed"].detail == "6 steps recomputed, at most 4 allowed (2 over)"
    assert got["min_fallbacks"].detail == (
        "1 damaged checkpoint(s) skipped, at least 2 expected (1 short)"
    )
    assert got["incidents"].detail == "2 incident(s) opened, expected 1 (+1)"
    assert got["verdicts"].detail == "verdicts replace, replace; expected drain-reset"
    assert got["incident_phases no-spare"].detail == (
        "no incident reached 'no-spare' (phases seen: node-down)"
    )
    assert got["held"].detail == "0 incident(s) held by the breaker, expected 1"
    assert got["out_of_service node2"].detail == "node2 is spare at the end"
    assert got["operator repaired node2"].detail == "answered accepted, expected refused: returned"


def test_a_digest_mismatch_shows_both() -> None:
    got = _by_name(check(Expectations(), _outcome(final_digest="cd" * 16)))
    assert got["digest_matches_control"].ok is False
    assert got["digest_matches_control"].detail == f"final {'cd' * 8} != control {'ab' * 8}"


def test_a_run_stopped_early_fails_with_the_reason() -> None:
    got = check(Expectations(), _outcome(error="timed out waiting for entry 1 (xid79)"))
    assert got[0] == Check("run", False, "timed out waiting for entry 1 (xid79)")


def _report(**phases: float | None) -> ReportSummary:
    full = {k: phases.get(k) for k in PHASES}
    inc = IncidentCost("inc-1", "node1", "xid79", full, 3, 15, 0)
    return ReportSummary((inc,), 0.7, "", None, None)


def test_phase_budgets_fail_by_how_much_unless_not_enforced() -> None:
    expect = Expectations(phases={"detection": 5, "replacement": 30, "restore": 1})
    report = _report(detection=0.4, replacement=31.25)
    got = _by_name(check(expect, _outcome(report=report)))
    assert got["phases.detection"] == Check("phases.detection", True, "0.4 s (inc-1), budget 5 s")
    assert got["phases.replacement"].ok is False
    assert got["phases.replacement"].detail == "31.2 s (inc-1), budget 30 s (1.2 s over)"
    assert got["phases.restore"] == Check("phases.restore", None, "no incident has a restore phase")
    lax = _by_name(check(expect, _outcome(report=report), enforce_budgets=False))
    assert lax["phases.replacement"].ok is None
    assert lax["phases.replacement"].detail.endswith("; budgets not enforced")


def test_without_a_report_budgets_are_not_checked_but_the_failure_is() -> None:
    out = _outcome(report=None, report_error="RunDirError: run.json: field 'node' ...")
    got = _by_name(check(Expectations(phases={"detection": 5}), out))
    assert got["report"] == Check(
        "report", False, "the report could not be written: RunDirError: run.json: field 'node' ..."
    )
    assert got["phases.detection"] == Check(
        "phases.detection", None, "not checked: no report (see the notes in run.json)"
    )


def test_the_summary_keeps_the_reports_phases_and_lost_progress(tmp_path: Path) -> None:
    report = build_report(load_run(SAMPLES / "xid79-spare"))
    png = tmp_path / "timeline.png"
    png.write_bytes(b"png")
    s = summarize(report, "the table", png, tmp_path / "report.md")
    assert len(s.incidents) == len(report.incidents) >= 1
    for got, inc in zip(s.incidents, report.incidents, strict=True):
        assert (got.id, got.node, got.fault) == (inc.id, inc.node, inc.fault)
        assert got.phases == {k: inc.phases[k] for k in PHASES}
        assert (got.steps_recomputed, got.restored_step) == (
            inc.steps_recomputed,
            inc.restored_step,
        )
        assert got.fallbacks == len(inc.fallbacks)
    assert (s.goodput, s.table, s.timeline, s.markdown) == (
        report.goodput.goodput,
        "the table",
        png,
        None,
    )


def test_the_schemas_phase_names_are_the_reports() -> None:
    assert PHASES == REPORT_PHASES
