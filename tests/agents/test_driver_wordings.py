"""The driver's own wordings of a fault, each with its source (samples/driver_wordings.yaml),
and the parser's promise on text it was never shown: it never raises, and a line cut short
reports at most what the whole line reports (never a fault the line does not state)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.kmsg import KernelFault, KernelLogParser
from agents.logfile import parse_file
from agents.logform import read_line
from agents.nvmsg import RULES, match_message
from tests.agents.helpers import case_lines, case_wanted

SAMPLES = Path(__file__).parent / "samples"


def _load(name: str, key: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = yaml.safe_load((SAMPLES / name).read_text())[key]
    return rows


ROWS = _load("driver_wordings.yaml", "rows")
CORPUS = _load("kernel_lines.yaml", "cases")
FIELDS = {
    "fault": "fault",
    "bus": "bus_id",
    "xid": "xid",
    "rule": "rule",
    "pid": "pid",
    "process": "process",
}
_NUMBERED = re.compile(r"^(s?xid)([0-9]+)$")
_RAW_NUMBER = re.compile(r"\): ([0-9]+)")
_SOURCE = re.compile(r"^(?:https://\S+|[\w.-]+/[\w.-]+:[\w./-]+)$")


def _feed(lines: list[str]) -> list[KernelFault]:
    parser = KernelLogParser()
    return [f for line in lines for f in parser.feed(line)] + parser.flush()


@pytest.mark.parametrize("row", ROWS, ids=[case_lines(r)[-1][:70] for r in ROWS])
def test_driver_wording_gives_exactly_its_faults(row: dict[str, Any]) -> None:
    found = _feed(case_lines(row))
    wanted = case_wanted(row)
    assert [f.fault for f in found] == [w["fault"] for w in wanted], row.get("why", "")
    for fault, want in zip(found, wanted, strict=True):
        for key, value in want.items():
            assert getattr(fault, FIELDS[key]) == value, key


def test_the_table_names_a_source_for_every_row_and_holds_both_kinds() -> None:
    for row in ROWS:
        assert set(row) <= {"line", "lines", "want", "source", "why"}, row
        assert _SOURCE.match(str(row.get("source", ""))), f"no source: {row}"
        for want in case_wanted(row):
            assert set(want) <= set(FIELDS), want
            assert want.get("rule", "xid") in RULES, want
    faults = {w["fault"] for r in ROWS for w in case_wanted(r)}
    assert {"xid79", "xid143"} <= faults  # fallen off / lost, and failed to initialise
    assert sum(1 for r in ROWS if r["want"] is None) >= 12  # lines that must stay silent
    assert len(ROWS) >= 40


# --- never raise, never invent ----------------------------------------------------------------

_CHARS = st.characters(codec="utf-8")  # any text a decoded log can hold
_TEXT = st.text(alphabet=_CHARS, max_size=200)
_DRIVER_START = st.sampled_from(
    ["", "NVRM: ", "NVRM: Xid (", "NVRM: Xid (PCI:0000:3b:00): ", "NVRM: GPU ",
     "NVRM: GPU 0000:3b:00.0: ", "nvidia-nvswitch0: SXid (", "[ 12.5] NVRM: ",
     "6,1,2,-;NVRM: ", "gpu-n3: ", "{\"MESSAGE\":\"NVRM: "]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(start=_DRIVER_START, rest=_TEXT)
def test_no_text_makes_the_parser_raise(start: str, rest: str) -> None:
    text = start + rest
    match_message(text)
    read_line(text)
    _feed([text, " " + rest, rest])


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.one_of(_TEXT, _DRIVER_START.flatmap(lambda s: _TEXT.map(s.__add__)))))
def test_no_sequence_of_lines_makes_the_parser_raise(lines: list[str]) -> None:
    _feed(lines)


def _all_cases() -> list[tuple[list[str], list[str]]]:
    cases = [(case_lines(c), [w["fault"] for w in case_wanted(c)]) for c in CORPUS]
    return cases + [(case_lines(r), [w["fault"] for w in case_wanted(r)]) for r in ROWS]


def _allowed(cut: KernelFault, whole: list[KernelFault], line: str) -> bool:
    """A fault of a line cut short is one the whole line gives, on the same GPU or on no GPU
    named (the last line of a split message, cut, no longer joins the line that named it); or
    the line ends inside its XID (SXid) number, which a line cut there cannot tell."""
    if any(cut.fault == f.fault and cut.bus_id in (f.bus_id, None) for f in whole):
        return True
    number = _RAW_NUMBER.search(cut.message)
    printed = _RAW_NUMBER.search(line)
    return bool(
        _NUMBERED.match(cut.fault) and number and printed and printed[1].startswith(number[1])
    )


def test_every_corpus_line_cut_short_reports_at_most_what_the_whole_line_does() -> None:
    """Cut the last line of every case at every length: nothing raises, and no cut gives a
    fault the whole case does not (an SXid detail line cut before its detail reads as a
    report cut short: it is the same switch's same error as the report before it)."""
    checked = 0
    for lines, _ in _all_cases():
        whole = _feed(lines)
        head, last = lines[:-1], lines[-1]
        for k in range(len(last) + 1):
            for cut in _feed([*head, last[:k]]):
                detail = re.search(r"SXid \([^)]*\): \d+, (?:Severity|Data)", last)
                assert _allowed(cut, whole, last) or detail, (last[:k], cut.fault)
            _feed([*head, last[k:]])  # cut at the front: only never raising is promised
            checked += 1
    assert checked > 10_000


# --- recover agent parse: what matched and why ------------------------------------------------


def test_parse_shows_the_rule_and_the_fields_of_each_fault_and_why_a_line_gave_none(
    tmp_path: Path,
) -> None:
    log = tmp_path / "wordings.log"
    log.write_text(
        "[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.\n"
        "[  885.242168] NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n"
        "[   87.938175] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  280.13\n"
        "[ 9001.000000] trainer: saw NVRM: Xid (PCI:0000:86:00): 95 in the log\n"
        "[ 9001.100000] NVRM: Xid (\n"
    )
    out = parse_file(log, "n1", False).splitlines()
    assert out[0].startswith("line 1: xid79 gpu ? 00000000:01:00.0: no XID number on ")
    assert "rule fell-off" in out[0]
    assert "bus=00000000:01:00.0" in out[0]
    assert out[0].endswith("[[seconds]]")
    assert "rule init-failed" in out[1]
    assert "RmInitAdapter" in out[1]
    assert out[2] == "3 line(s) mention the driver but report no fault:"
    assert out[3].startswith("  line 3: ")
    assert "no fault rule" in out[3]
    assert "not the driver's own message" in out[4]
    assert "cut short" in out[5]
