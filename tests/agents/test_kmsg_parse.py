"""The kernel-log parser over every line form in samples/kmsg_lines.yaml, and its near misses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.kmsg import (
    bus_map,
    kernel_bus_id,
    kmsg_event_id,
    nvml_bus_id,
    parse_line,
    parse_lines,
    to_event,
)
from recovery.model import HealthEvent, Source

SAMPLES = yaml.safe_load((Path(__file__).parent / "samples" / "kmsg_lines.yaml").read_text())
MATCHES: list[dict[str, Any]] = SAMPLES["matches"]
NEAR_MISSES: list[str] = SAMPLES["near_misses"]


@pytest.mark.parametrize("case", MATCHES, ids=[c["line"][:60] for c in MATCHES])
def test_every_fault_line_form_parses(case: dict[str, Any]) -> None:
    fault = parse_line(case["line"])
    assert fault is not None, case["line"]
    assert fault.fault == case["fault"]
    assert fault.bus_id == case["bus"]
    for key, attr in [("xid", "xid"), ("pid", "pid"), ("process", "process"), ("seq", "seq")]:
        if key in case:
            assert getattr(fault, attr) == case[key], key
    if "text" in case:
        assert fault.text == case["text"]
    if "kernel_ts" in case:
        assert fault.kernel_ts == pytest.approx(case["kernel_ts"])
    if "kernel_ts" not in case and "seq" not in case:
        assert fault.seq is None


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_lines_that_only_mention_an_xid_are_not_faults(line: str) -> None:
    assert parse_line(line) is None


def test_samples_cover_every_form_the_reference_lists() -> None:
    lines = {c["line"] for c in MATCHES}
    for required in [
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (0000:03:00): 14, Channel 00000001",
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    ]:
        assert required in lines


@pytest.mark.parametrize(
    ("given", "nvml"),
    [
        ("0000:3b:00", "00000000:3B:00.0"),
        ("0000:3B:00", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        ("0000:18:00.0", "00000000:18:00.0"),
        ("0001:af:1f.3", "00000001:AF:1F.3"),
    ],
)
def test_bus_ids_are_normalised_to_nvml_form(given: str, nvml: str) -> None:
    assert nvml_bus_id(given) == nvml
    assert nvml_bus_id(kernel_bus_id(given)) == nvml.rsplit(".", 1)[0] + ".0"


@pytest.mark.parametrize("bad", ["", "3b:00", "0000:3b", "0000:3g:00", "0000:3b:00.9", "x"])
def test_malformed_bus_ids_are_refused_with_the_expected_form(bad: str) -> None:
    with pytest.raises(ValueError, match="like 0000:3b:00"):
        nvml_bus_id(bad)


def test_bus_map_finds_the_accelerator_of_a_kernel_line() -> None:
    devices = [(0, "00000000:18:00.0"), (1, "00000000:3B:00.0"), (2, "00000000:86:00.1")]
    buses = bus_map(devices)
    for line, index in [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 1),
        ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", 0),
        ("NVRM: Xid (PCI:0000:86:00): 95, pid=1, name=x, Uncontained: FBHUB.", 2),
        ("NVRM: Xid (PCI:0000:af:00): 95, pid=1, name=x, Uncontained: FBHUB.", None),
    ]:
        fault = parse_line(line)
        assert fault is not None
        event = to_event(fault, node="n1", boot_id="b", observed_at=1.0, buses=buses)
        assert event.accelerator == index, line
        assert event.bus_id == fault.bus_id


def test_event_carries_the_fault_and_a_readable_message(node: str, boot: str) -> None:
    line = (
        "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus."
    )
    (event,) = parse_lines([line, "unrelated"], node=node, boot_id=boot, observed_at=1.8e9)
    assert isinstance(event, HealthEvent)
    assert (event.node, event.source, event.fault) == (node, Source.kmsg, "xid79")
    assert event.observed_at == 1.8e9
    assert event.message == (
        "XID 79 on 00000000:3B:00.0 (pid 1234, python): GPU has fallen off the bus."
    )
    numberless = parse_lines(
        ["NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."],
        node=node,
        boot_id=boot,
        observed_at=1.0,
    )
    assert numberless[0].message.startswith("no XID number on 00000000:18:00.0: ")


def test_ids_are_stable_across_rereads_and_distinct_across_boots_and_nodes(node: str) -> None:
    record = "3,1742,5123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    fault = parse_line(record)
    assert fault is not None
    first = kmsg_event_id(node, "boot-a", fault)
    again = parse_line(record)
    assert again is not None
    assert kmsg_event_id(node, "boot-a", again) == first
    assert kmsg_event_id(node, "boot-b", fault) != first
    assert kmsg_event_id("gpu-n4", "boot-a", fault) != first
    # The same message under another sequence number is another observation.
    later = parse_line(record.replace(",1742,", ",1743,"))
    assert later is not None
    assert kmsg_event_id(node, "boot-a", later) != first


def test_lines_without_a_sequence_number_are_identified_by_their_text(node: str) -> None:
    a = parse_line("[1.000000] NVRM: Xid (PCI:0000:3b:00): 95, pid=1, name=x, Uncontained")
    b = parse_line("[1.000001] NVRM: Xid (PCI:0000:3b:00): 95, pid=1, name=x, Uncontained")
    assert a is not None
    assert b is not None
    assert kmsg_event_id(node, "b", a) != kmsg_event_id(node, "b", b)
    assert kmsg_event_id(node, "b", a) == kmsg_event_id(node, "b", a)
