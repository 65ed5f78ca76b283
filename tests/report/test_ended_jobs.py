"""The report reads the phases of a job a fault ended: ``job-ended``, the coordinator's
``jobs-requeued``, ``requeue-refused``. The real xid79 run is rewritten as the journal of a
run whose process died first would have it (same times, the phases the coordinator adds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recovery.report import PHASES
from service.reportgen import write_report
from tests.report.helpers import copy_sample


def _rewrite(run_dir: Path, phases: dict[str, str]) -> dict[str, Any]:
    """Give the sample's incident ``phases`` (name -> detail) just after its node-down."""
    path = run_dir / "incidents.json"
    incidents = json.loads(path.read_text())
    inc = incidents[0]
    (down,) = [p for p in inc["phases"] if p["name"] == "node-down"]
    kept = [p for p in inc["phases"] if p["name"] not in phases]
    for i, (name, detail) in enumerate(phases.items(), 1):
        at = {"wall": down["at"]["wall"] + 0.01 * i, "mono": down["at"]["mono"] + 0.01 * i}
        kept.append({"name": name, "at": at, "detail": detail})
    inc["phases"] = kept
    path.write_text(json.dumps(incidents))
    return dict(inc)


def test_a_job_the_coordinator_requeued_reads_in_what_happened(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    _rewrite(run_dir, {
        "job-ended": "1 FAILED exit 134 at 1796122134",
        "jobs-requeued": "1 (FAILED exit 134 at 1796122134; requeued by the coordinator)",
    })  # fmt: skip
    report = write_report(run_dir)
    md = (run_dir / "report.md").read_text()
    happened = md.split("### What happened")[1].split("###")[0]
    assert "- A job ended before Slurm could requeue it: 1 FAILED exit 134 at 1796122134" in (
        happened
    )
    assert "- The coordinator requeued it: 1 (FAILED exit 134" in happened
    assert "| job-ended | 1 FAILED exit 134 at 1796122134 |" in md
    (inc,) = report.incidents
    assert list(inc.phases) == list(PHASES)
    assert inc.phases["requeue_wait"] is not None  # node down -> the job running again


def test_a_refused_requeue_says_why(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    why = "1: FAILED exit 93: exit 93 asks not to be restarted"
    _rewrite(run_dir, {"job-ended": "1 FAILED exit 93 at 1796122134", "requeue-refused": why})
    write_report(run_dir)
    md = (run_dir / "report.md").read_text()
    happened = md.split("### What happened")[1].split("###")[0]
    assert f"- Not requeued: {why}." in happened
    assert "The coordinator requeued it" not in happened


def test_a_plain_xid79_run_says_nothing_of_ended_jobs(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    write_report(run_dir)
    md = (run_dir / "report.md").read_text()
    assert "ended before Slurm could requeue" not in md
    assert "Not requeued" not in md
