"""The report's files and ``recover report DIR`` on copies of the real runs."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from recover import main
from recovery.report import PHASES
from service.reportgen import write_report
from tests.report.helpers import NAMES, copy_sample

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk (always the first)."""
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("name", NAMES)
def test_the_three_files_are_written(tmp_path: Path, name: str) -> None:
    run_dir = copy_sample(name, tmp_path)
    report = write_report(run_dir)
    doc = json.loads((run_dir / "report.json").read_text())
    assert doc == json.loads(json.dumps(report.to_json()))
    for inc in doc["incidents"]:
        assert list(inc["phases"]) == list(PHASES)
    png = (run_dir / "timeline.png").read_bytes()
    width, height = _png_size(png)
    assert (width, height) == (1430, 858)
    assert len(png) > 40_000  # a drawn figure, not an empty canvas
    assert (run_dir / "report.md").read_text().startswith("# Incident report")


def test_the_runbook_entry_says_what_happened_did_cost_and_next(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-fallback", tmp_path)
    write_report(run_dir)
    md = (run_dir / "report.md").read_text()
    for section in ("What happened", "What the toolkit did", "What it cost", "What to check next"):
        assert f"### {section}" in md
    assert 'Slurm reason "recover: xid79 GPU has fallen off the bus"' in md
    assert "`recover node repaired node1`" in md
    assert "failed verification" in md
    assert "fell back" not in md.split("### What to check")[0]
    assert "| requeue_wait |" in md
    assert "Goodput" in md
    assert "wasted progress from disruption" in md
    assert "![timeline](timeline.png)" in md


def _commands(md: str) -> list[list[str]]:
    return [c.split()[1:] for c in re.findall(r"`(recover [^`]+)`", md)]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_command_the_runbook_names_exists(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_sample(name, tmp_path)
    write_report(run_dir)
    for argv in _commands((run_dir / "report.md").read_text()):
        assert main([*argv, "--help"]) == 0, argv
    capsys.readouterr()


@pytest.mark.slow
def test_recover_report_prints_the_table_and_the_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    for phase in PHASES:
        if phase == "diagnose":  # an xid79 is no stall: no stacks to take
            assert re.search(r"^diagnose\s+-\s+-\s+n/a: no stacks", out, re.MULTILINE)
            continue
        assert re.search(rf"^{phase}\s+\d+\.\d\d s", out, re.MULTILINE), phase
    assert "lost progress: 0 step(s)" in out
    assert "replacement: 0.26 s" in out
    assert "goodput" in out
    assert "total (wall time)" in out
    assert f"timeline: {run_dir / 'timeline.png'}" in out
    assert (run_dir / "timeline.png").stat().st_size > 0


@pytest.mark.slow
def test_recover_report_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_sample("xid79-empty-pool", tmp_path)
    assert main(["report", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"]["timeline.png"] == str(run_dir / "timeline.png")
    [inc] = doc["incidents"]
    assert inc["spare"] == "node1"
    assert inc["returned_to_pool"] is True
    assert set(inc["phases"]) == set(PHASES)


def test_recover_report_on_a_broken_directory_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = copy_sample("no-fault", tmp_path)
    (run_dir / "incidents.json").unlink()
    assert main(["report", str(run_dir)]) == 2
    assert "incidents.json is missing" in capsys.readouterr().err
    assert not (run_dir / "report.json").exists()
