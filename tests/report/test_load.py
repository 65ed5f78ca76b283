"""Reading a run directory: every sample loads, and a broken file is named with its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.report import RunDirError, load_run
from tests.report.helpers import NAMES, SAMPLES, Raw, copy_sample


@pytest.mark.parametrize("name", NAMES)
def test_every_sample_loads(name: str) -> None:
    raw = Raw(SAMPLES / name)
    run = load_run(SAMPLES / name)
    assert run.scenario == raw.run["scenario"]
    assert len(run.incidents) == len(raw.incidents)
    assert len(run.events) == len(raw.events)
    assert run.job.id == raw.run["job"]["id"]
    for inc, doc in zip(run.incidents, raw.incidents, strict=True):
        assert inc.id == doc["id"]
        assert [p.at for p in inc.phases] == sorted(p["at"]["wall"] for p in doc["phases"])


# Without run.json the directory is read as a run started by hand (tests/report/test_by_hand.py).
@pytest.mark.parametrize("missing", ["incidents.json", "events.jsonl"])
def test_a_missing_file_of_a_scenario_run_is_named(tmp_path: Path, missing: str) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    (run_dir / missing).unlink()
    with pytest.raises(RunDirError, match=rf"{missing} is missing"):
        load_run(run_dir)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="is not a directory"):
        load_run(tmp_path / "nowhere")


def _broken_run(tmp_path: Path, key: str, value: object) -> Path:
    raw = Raw(SAMPLES / "xid79-spare")
    if value is None:
        del raw.run[key]
    else:
        raw.run[key] = value
    raw.write(tmp_path / "broken")
    return tmp_path / "broken"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("started", "soon", r"run\.json: field 'started' must be a number"),
        ("finished", None, r"run\.json: field 'finished' is missing"),
        ("format", 2, r"format 2 is not known; this version reads 1"),
        (
            "faults",
            [{"fault": "xid79", "node": "node1", "via": "kmsg"}],
            r"faults\[0\]: field 'at'",
        ),
        ("job", {"id": "1"}, r"run\.json job: field 'nodes' is missing"),
        ("started", True, r"field 'started' must be a number"),
        ("finished", 1.0, r"'finished' \(1\.0\) is before 'started'"),
    ],
)
def test_a_malformed_run_json_names_the_field(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    with pytest.raises(RunDirError, match=message):
        load_run(_broken_run(tmp_path, key, value))


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (None, r"phases\[2\]: field 'at' is missing"),
        ({"mono": 1.0}, r"phases\[2\] at: field 'wall'"),
    ],
)
def test_a_malformed_incident_names_the_incident_and_the_field(
    tmp_path: Path, at: object, message: str
) -> None:
    raw = Raw(SAMPLES / "xid79-spare")
    if at is None:
        del raw.incidents[0]["phases"][2]["at"]
    else:
        raw.incidents[0]["phases"][2]["at"] = at
    raw.write(tmp_path / "broken")
    ident = raw.incidents[0]["id"]
    with pytest.raises(RunDirError, match=rf"incidents\.json: incident 0 \({ident}\) {message}"):
        load_run(tmp_path / "broken")


def test_incidents_must_be_a_list(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    (run_dir / "incidents.json").write_text(json.dumps({"id": "inc-1"}))
    with pytest.raises(RunDirError, match="expected a JSON list of incidents"):
        load_run(run_dir)


def test_invalid_json_is_named(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(RunDirError, match=r"run\.json is not valid JSON"):
        load_run(run_dir)


def test_a_bad_event_line_is_named_with_its_number(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    lines[3] = "garbage\n"
    (run_dir / "events.jsonl").write_text("".join(lines))
    with pytest.raises(RunDirError, match=r"events\.jsonl line 4 is not valid JSON"):
        load_run(run_dir)


def test_an_unknown_event_lists_the_known_ones(tmp_path: Path) -> None:
    raw = Raw(SAMPLES / "xid79-spare")
    raw.events[5]["event"] = "exploded"
    raw.write(tmp_path / "broken")
    with pytest.raises(RunDirError, match=r"line 6: unknown event 'exploded'\. Known: .*step"):
        load_run(tmp_path / "broken")


def test_a_step_event_needs_its_step(tmp_path: Path) -> None:
    raw = Raw(SAMPLES / "xid79-spare")
    index = next(i for i, e in enumerate(raw.events) if e["event"] == "step")
    del raw.events[index]["step"]
    raw.write(tmp_path / "broken")
    with pytest.raises(RunDirError, match=rf"line {index + 1}: a 'step' event needs field 'step'"):
        load_run(tmp_path / "broken")


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    whole = len(load_run(run_dir).events)
    with (run_dir / "events.jsonl").open("a") as f:
        f.write('{"event": "step", "ts": 1')  # a writer killed mid-line
    assert len(load_run(run_dir).events) == whole
