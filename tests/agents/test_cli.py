"""``recover agent parse``: the function and the typer sub-app, on a saved incident log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.cli import app, parse_buses
from agents.logfile import parse_file
from recovery.errors import UsageError
from recovery.model import HealthEvent

INCIDENT = Path(__file__).parent / "samples" / "incident.dmesg"
GPUS = ["2=00000000:86:00.0", "5=00000000:3B:00.0"]


def test_text_lists_every_fault_line_with_its_line_number() -> None:
    text = parse_file(INCIDENT, "gpu-n3", False, buses=parse_buses(GPUS))
    lines = text.splitlines()
    events = [ln for ln in lines if ln.startswith("line ")]
    assert events[0].startswith("line 5: xid95 gpu 2 00000000:86:00.0: XID 95 on ")
    assert events[0].endswith("[[seconds]]")  # the presentation found
    assert [ln.split(":")[0] for ln in events] == [
        "line 5", "line 6", "line 7", "line 9", "line 10", "line 11"
    ]  # fmt: skip
    assert events[-1].startswith("line 11: xid79 gpu 5 00000000:3B:00.0: no XID number")
    # What mentions the driver but reports nothing is shown, so a miss cannot hide.
    silent = lines[len(events) :]
    assert silent[0] == "3 line(s) mention the driver but report no fault:"
    assert [ln.split(":")[0].strip() for ln in silent[1:-1]] == ["line 3", "line 8", "line 12"]
    assert lines[-1] == (
        f"{INCIDENT}: 6 event(s) from 12 line(s); faults: xid79, xid95; forms: [seconds] (6)"
    )


@pytest.mark.parametrize(("sample", "unit"), [("journal.json", "line(s)"),
                                              ("journal.export", "journal entries")])  # fmt: skip
def test_journal_json_and_export_files_give_the_kernel_faults_only(sample: str, unit: str) -> None:
    path = INCIDENT.parent / sample
    events = [HealthEvent.model_validate(e) for e in json.loads(parse_file(path, "n1", True))]
    assert [e.fault for e in events] == [
        "xid48", "xid79", "xid79", "xid95", "sxid24007", "gpu-reset-required"
    ]  # fmt: skip
    assert events[1].message.endswith("not responding to commands.")  # three lines, one event
    assert "tr\ufffdin" in events[2].message  # MESSAGE as bytes, not valid UTF-8
    text = parse_file(path, "n1", False)
    assert "[journal: syslog myapp] NVRM: Xid" in text  # a program's line: listed, no event
    assert f"6 event(s) from 9 {unit}" in text.splitlines()[-1]


def test_json_pretty_output_is_read_entry_by_entry(tmp_path: Path) -> None:
    entries = [json.loads(ln) for ln in (INCIDENT.parent / "journal.json").read_text().splitlines()]
    pretty = tmp_path / "pretty.json"
    pretty.write_text("\n".join(json.dumps(e, indent=2) for e in entries) + "\n")
    assert len(json.loads(parse_file(pretty, "n1", True))) == 6


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


def test_the_metrics_address_is_host_and_port() -> None:
    from agents.cli import parse_listen
    from recovery.errors import UsageError

    assert parse_listen("127.0.0.1:9470") == ("127.0.0.1", 9470)
    assert parse_listen("[::1]:9470") == ("::1", 9470)
    for bad in ("9470", "host:", ":9470", "host:0", "host:70000", "host:http"):
        with pytest.raises(UsageError, match=r"expected HOST:PORT, e\.g\. 127\.0\.0\.1:9470"):
            parse_listen(bad)
