"""A stall its job's in-allocation supervisor handled, as the report tells it: fault ->
noticed -> stacks captured -> launch stopped -> training again from the supervisor's journal,
the hang in its own goodput bucket; and without that journal, the coordinator's account.

The sample ``hang-in-allocation`` is a real run (``benchmarks.hang_bench --mode
in-allocation``, main-thread-hang, Slurm 25.11): see samples/README.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recovery.report import build_report, load_run
from recovery.report.goodput import HUNG, INFRA_RECOVERY
from recovery.report.load import supervisor_entries
from recovery.report.runbook import render_markdown
from recovery.report.table import render_table
from tests.report.helpers import copy_sample

SAMPLE = "hang-in-allocation"


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "supervisor-1.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _at(journal: list[dict[str, Any]], event: str) -> float:
    return float(next(e["unix"] for e in journal if e["event"] == event))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return copy_sample(SAMPLE, tmp_path)


def test_the_phases_run_from_the_supervisors_journal(run_dir: Path) -> None:
    journal = _journal(run_dir)
    report = build_report(load_run(run_dir))
    (inc,) = report.incidents
    assert inc.supervised
    fault = inc.fault_at
    noticed, stacks, ended = (_at(journal, e) for e in ("stalled", "stacks", "step-ended"))
    assert inc.phases["detection"] == pytest.approx(noticed - fault)
    assert inc.phases["diagnose"] == pytest.approx(stacks - noticed)
    assert inc.phases["stall"] == pytest.approx(ended - fault)
    restarted = report.processes[inc.successor_index or 0]
    assert inc.phases["job_restart"] == pytest.approx(restarted.started - ended)
    # No requeue: the chain goes stall -> relaunch -> restore -> warmup, and adds up.
    assert inc.chain == ("stall", "job_restart", "restore", "warmup")
    total = sum(inc.phases[p] or 0.0 for p in inc.chain)
    assert total == pytest.approx(inc.recovery_s)
    # The coordinator's decision is kept as its own mark, later than the supervisor's.
    assert inc.marks["decided"] > noticed
    # Every process stopped when the launch ended, not at its last update before the hang.
    assert all(t == pytest.approx(ended) for t in inc.stopped)
    assert [e for _, e, _ in inc.supervisor] == [
        "stalled",
        "stacks",
        "step-ended",
        "relaunch",
        "launched",
    ]


def test_the_hang_has_its_own_goodput_bucket(run_dir: Path) -> None:
    report = build_report(load_run(run_dir))
    (inc,) = report.incidents
    g = report.goodput
    hung = g.bucket(HUNG).seconds
    # At most fault -> stopped for each of the 4 processes, and most of it: the processes
    # did nothing else meanwhile.
    window = inc.marks["all_stopped"] - inc.fault_at
    assert 0.75 * 4 * window < hung <= 4 * window + 1e-6
    assert g.productive_s + sum(b.seconds for b in g.badput) == pytest.approx(g.wall_s)
    # Without the journal the same time was recovery: the hang is taken out of it.
    (run_dir / "supervisor-1.jsonl").unlink()
    plain = build_report(load_run(run_dir)).goodput
    assert plain.bucket(HUNG).seconds < hung
    assert plain.bucket(INFRA_RECOVERY).seconds > g.bucket(INFRA_RECOVERY).seconds


def test_the_runbook_and_table_tell_the_supervisors_steps(run_dir: Path) -> None:
    report = build_report(load_run(run_dir))
    md = render_markdown(report)
    assert "The job's supervisor saw the stall +" in md
    assert "| stalled | behind: rank 0 on node2 at step 10" in md
    assert "hung until stopped (a stall)" in md
    text = render_table(report)
    assert "fault -> the job's supervisor saw the stall" in text
    assert "its supervisor noticed -> every rank's stacks captured" in text
    assert "fault -> training again = stall + job_restart + restore + warmup" in text


def test_without_the_supervisors_journal_the_coordinator_tells_it(run_dir: Path) -> None:
    (run_dir / "supervisor-1.jsonl").unlink()
    (inc,) = build_report(load_run(run_dir)).incidents
    assert not inc.supervised
    assert inc.phases["detection"] == pytest.approx(inc.marks["decided"] - inc.fault_at)
    # The agents wrote the stacks as they saw the stall, before the coordinator decided.
    assert inc.phases["diagnose"] is None
    assert "before the decision" in inc.why["diagnose"]
    assert inc.marks["stacks"] < inc.marks["decided"]


def test_a_torn_or_foreign_supervisor_line_is_skipped(run_dir: Path) -> None:
    path = run_dir / "supervisor-1.jsonl"
    good = path.read_text()
    path.write_text('{"event": "stalled", "unix": "soon"}\n[1, 2]\nnot json\n' + good + '{"ev')
    entries = supervisor_entries(run_dir)
    assert len(entries) == len(good.splitlines())
    assert [e.at for e in entries] == sorted(e.at for e in entries)
    (inc,) = build_report(load_run(run_dir)).incidents
    assert inc.supervised
