"""Bus ids, events and their ids, beyond the corpus (test_kernel_corpus.py): the same kernel
line in any presentation is one observation; different lines are different ones."""

from __future__ import annotations

import json

import pytest

from agents.busid import bus_map, kernel_bus_id, nvml_bus_id
from agents.kmsg import KernelLogParser, kmsg_event_id, parse_line, parse_lines, to_event
from recovery.model import DriverAction, HealthEvent, Source

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("given", "nvml"),
    [
        ("0000:3b:00", "00000000:3B:00.0"),
        ("0000:3B:00", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        ("0000:3B:00.0", "00000000:3B:00.0"),  # NVML's legacy form
        ("0000:18:00.0", "00000000:18:00.0"),
        ("3b:00", "00000000:3B:00.0"),  # no domain
        ("3b:00.0", "00000000:3B:00.0"),  # lspci
        ("PCI:0000:3b:00", "00000000:3B:00.0"),
        ("0001:af:1f.3", "00000001:AF:1F.3"),
    ],
)
def test_every_spelling_of_a_bus_id_names_the_same_gpu(given: str, nvml: str) -> None:
    assert nvml_bus_id(given) == nvml
    assert nvml_bus_id(kernel_bus_id(given)) == nvml.rsplit(".", 1)[0] + ".0"


@pytest.mark.parametrize("bad", ["", "3b", "0000:3b", "0000:3g:00", "0000:3b:00.9", "x:3b:00"])
def test_malformed_bus_ids_are_refused_with_the_forms_that_work(bad: str) -> None:
    with pytest.raises(ValueError, match="like 0000:3b:00"):
        nvml_bus_id(bad)


def test_bus_map_finds_the_gpu_whatever_spelling_either_side_uses() -> None:
    buses = bus_map([(0, "00000000:18:00.0"), (1, "3b:00.0"), (2, "0000:86:00.1")])
    for line, index in [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 1),
        ("NVRM: Xid (PCI:3b:00): 79, GPU has fallen off the bus.", 1),
        ("NVRM: GPU 00000000:3B:00.0: GPU has fallen off the bus.", 1),
        ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", 0),
        ("NVRM: Xid (PCI:0000:86:00): 95, pid=1, name=x, Uncontained: FBHUB.", 2),
        ("NVRM: Xid (PCI:0000:af:00): 95, pid=1, name=x, Uncontained: FBHUB.", None),
    ]:
        fault = parse_line(line)
        assert fault is not None
        event = to_event(fault, node="n1", boot_id="b", observed_at=1.0, buses=buses)
        assert event.accelerator == index, line
        assert event.bus_id == fault.bus_id


def test_an_nvswitch_is_never_taken_for_a_gpu() -> None:
    buses = bus_map([(4, "0000:c5:00.0")])  # even where a GPU had the switch's bus id
    fault = parse_line("nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 24007, Fatal, Link 44 x")
    assert fault is not None
    event = to_event(fault, node="n1", boot_id="b", observed_at=1.0, buses=buses)
    assert (event.fault, event.accelerator, event.bus_id) == ("sxid24007", None, "00000000:C5:00.0")
    assert event.message.startswith("SXid 24007 on 00000000:C5:00.0: NVSwitch 3: Fatal")


def test_event_carries_the_fault_and_a_readable_message(node: str, boot: str) -> None:
    (event,) = parse_lines([f"[12345.678901] {XID79}", "unrelated"], node=node, boot_id=boot,
                           observed_at=1.8e9)  # fmt: skip
    assert isinstance(event, HealthEvent)
    assert (event.node, event.source, event.fault) == (node, Source.kmsg, "xid79")
    assert event.observed_at == 1.8e9
    assert event.message == (
        "XID 79 on 00000000:3B:00.0 (pid 1234, python): GPU has fallen off the bus."
    )
    (numberless,) = parse_lines(
        ["NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."], node=node, boot_id=boot,
        observed_at=1.0,
    )  # fmt: skip
    assert numberless.message.startswith("no XID number on 00000000:18:00.0: ")
    (action,) = parse_lines(
        ["NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to "
         "0x2 (Node Reboot Required)"], node=node, boot_id=boot, observed_at=1.0,
    )  # fmt: skip
    assert action.driver_action is DriverAction.node_reboot


def test_one_kernel_line_has_one_id_in_every_presentation(node: str, boot: str) -> None:
    """/dev/kmsg, dmesg, syslog with the kernel's stamp and journald name the same line."""
    entry = {"_TRANSPORT": "kernel", "_SOURCE_MONOTONIC_TIMESTAMP": "1843308145",
             "MESSAGE": XID79}  # fmt: skip
    forms = [
        f"6,1742,1843308145,-;{XID79}",
        f"[ 1843.308145] {XID79}",
        f"<4>[ 1843.308145] {XID79}",
        f"Dec  1 07:49:49 {node} kernel: [ 1843.308145] {XID79}",
        json.dumps(entry),
    ]
    ids = set()
    for line in forms:
        fault = parse_line(line)
        assert fault is not None, line
        ids.add(kmsg_event_id(node, boot, fault))
    assert len(ids) == 1


def test_ids_are_stable_across_rereads_and_distinct_across_lines_boots_and_nodes(
    node: str,
) -> None:
    record = f"6,1742,1843308145,-;{XID79}"
    fault, again = parse_line(record), parse_line(record)
    assert fault is not None
    assert again is not None
    first = kmsg_event_id(node, "boot-a", fault)
    assert kmsg_event_id(node, "boot-a", again) == first
    assert kmsg_event_id(node, "boot-b", fault) != first
    assert kmsg_event_id("gpu-n4", "boot-a", fault) != first
    later = parse_line(record.replace("1843308145", "1843308146"))  # another moment
    assert later is not None
    assert kmsg_event_id(node, "boot-a", later) != first


def test_lines_without_a_kernel_stamp_are_identified_by_their_text(node: str) -> None:
    a = parse_line(f"Dec  1 07:49:49 {node} kernel: {XID79}")
    b = parse_line(f"Dec  1 07:49:50 {node} kernel: {XID79}")
    assert a is not None
    assert b is not None
    assert kmsg_event_id(node, "b", a) != kmsg_event_id(node, "b", b)
    assert kmsg_event_id(node, "b", a) == kmsg_event_id(node, "b", a)


def test_two_gpus_falling_off_in_the_same_second_are_two_faults(node: str) -> None:
    parser = KernelLogParser()
    found = []
    for bus in ("0000:3b:00.0", "0000:86:00.0"):
        for text in (f"NVRM: The NVIDIA GPU {bus}", "NVRM: (PCI ID: 10de:2330) installed in "
                     "this system has", "NVRM: fallen off the bus and is not responding to "
                     "commands."):  # fmt: skip
            found += parser.feed(f"Dec  1 07:49:49 {node} kernel: {text}")
    assert [f.bus_id for f in found] == ["00000000:3B:00.0", "00000000:86:00.0"]
    ids = {kmsg_event_id(node, "b", f) for f in found}
    assert len(ids) == 2
