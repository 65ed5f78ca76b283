"""``recover agent parse``: the function and the typer sub-app, on a saved incident log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.cli import app, parse_buses, parse_file
from recovery.errors import UsageError
from recovery.model import HealthEvent

INCIDENT = Path(__file__).parent / "samples" / "incident.dmesg"
GPUS = ["2=00000000:86:00.0", "5=00000000:3B:00.0"]


def test_text_lists_every_fault_line_with_its_line_number() -> None:
    text = parse_file(INCIDENT, "gpu-n3", False, buses=parse_buses(GPUS))
    lines = text.splitlines()
    assert lines[0].startswith("line 5: xid95 gpu 2 00000000:86:00.0: XID 95 on ")
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "line 5", "line 6", "line 7", "line 9", "line 10", "line 11"
    ]  # fmt: skip
    assert lines[-2].startswith("line 11: xid79 gpu 5 00000000:3B:00.0: no XID number")
    assert lines[-1] == f"{INCIDENT}: 6 event(s) from 12 line(s); faults: xid79, xid95"


def test_json_is_an_array_of_schema_events() -> None:
    events = json.loads(parse_file(INCIDENT, "gpu-n3", True))
    parsed = [HealthEvent.model_validate(e) for e in events]
    assert [e.fault for e in parsed] == ["xid95"] * 4 + ["xid79"] * 2
    assert all(e.node == "gpu-n3" and e.accelerator is None for e in parsed)
    assert len({e.id for e in parsed}) == 6


def test_a_window_folds_repeats_by_the_logs_own_timestamps() -> None:
    events = json.loads(parse_file(INCIDENT, "gpu-n3", True, window_s=30))
    got = [(e["fault"], e["count"]) for e in events]
    # 95 at 9000.1 passes, two repeats fold; 9050 opens a new window (the first one's summary
    # leaves then); 79 at 9100.5 passes and its numberless twin folds into it.
    assert got == [("xid95", 1), ("xid95", 2), ("xid95", 1), ("xid79", 1), ("xid79", 1)]


def test_a_log_without_faults_says_so(tmp_path: Path) -> None:
    log = tmp_path / "quiet.log"
    log.write_text("[1.0] usb 1-1: new device\n")
    assert parse_file(log, "n1", False) == f"{log}: 0 event(s) from 1 line(s); no fault lines"
    assert parse_file(log, "n1", True) == "[]"


def test_bad_input_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read kernel log"):
        parse_file(tmp_path / "missing", "n1", False)
    with pytest.raises(UsageError, match="invalid node name"):
        parse_file(INCIDENT, "1-bad node", False)
    with pytest.raises(UsageError, match="expected INDEX=BUSID"):
        parse_buses(["zero=00000000:3B:00.0"])
    with pytest.raises(UsageError, match="expected INDEX=BUSID"):
        parse_buses(["0=3b"])


def test_the_typer_command() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["parse", str(INCIDENT), "--node", "gpu-n3", "--gpu", GPUS[0]])
    assert result.exit_code == 0, result.output
    assert "line 5: xid95 gpu 2 " in result.output
    result = runner.invoke(app, ["parse", str(INCIDENT), "--json", "--window", "30"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)) == 5
