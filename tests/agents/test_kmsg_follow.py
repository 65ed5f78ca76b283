"""The kernel-log follower on real files: from the start or the end, resuming at a saved mark,
appends, partial lines, truncation, rotation, a file that appears later, a stop event; and the
fault-line writer round trip."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.busid import bus_map
from agents.follow import DEV_KMSG, KmsgFollower, append_fault_line, format_fault_line
from agents.kmsg import kmsg_event_id, parse_line
from agents.readmark import Mark
from recovery.model import HealthEvent
from recovery.ports.clock import FakeClock
from tests.agents.helpers import wait_for

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
XID95 = "NVRM: Xid (PCI:0000:86:00): 95, pid=7, name=python, Uncontained: FBHUB.\n"


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


Make = Callable[..., KmsgFollower]


@pytest.fixture
def logs() -> list[str]:
    return []


@pytest.fixture
def make(clock: FakeClock, logs: list[str]) -> Iterator[Make]:
    """``make(path, **options)``: a follower that is closed when the test ends."""
    made: list[KmsgFollower] = []

    def _make(path: Path, **kw: Any) -> KmsgFollower:
        f = KmsgFollower(node="gpu-n3", boot_id="b1", clock=clock, path=path, log=logs.append, **kw)
        made.append(f)
        return f

    yield _make
    for f in made:
        f.close()


def test_from_the_end_reads_only_new_lines(tmp_path: Path, clock: FakeClock, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text(XID79)  # already there, and not wanted (--kmsg-from end)
    f = make(log, from_start=False)
    assert f.poll() == []
    _append(log, "[1.0] usb 1-1: new device\n" + XID95)
    clock.advance(5)
    (event,) = f.poll()
    assert event.fault == "xid95"
    assert event.observed_at == clock.now().wall
    assert f.poll() == []


def test_by_default_what_is_already_there_is_read(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text(XID79 + XID95)  # logged before the agent started: reported once
    f = make(log)
    assert [e.fault for e in f.poll()] == ["xid79", "xid95"]


def test_each_event_comes_with_the_mark_of_its_line(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text("[1.0] usb 1-1: new device\n" + XID79 + XID95)
    st = log.stat()
    (_, m79), (_, m95) = make(log).poll_marked()
    assert m79 == Mark(
        "b1", dev=st.st_dev, ino=st.st_ino, offset=len("[1.0] usb 1-1: new device\n" + XID79)
    )
    assert m95.offset == st.st_size


def test_a_restart_resumes_after_the_mark_while_the_file_is_the_same(
    tmp_path: Path, make: Make
) -> None:
    log = tmp_path / "kmsg"
    log.write_text(XID79 + XID95)
    (_, first), _ = make(log).poll_marked()
    assert [e.fault for e in make(log, resume=first).poll()] == ["xid95"]
    # A file outlives a reboot (kern.log): what was read of it in the last boot stays read.
    other_boot = Mark("b0", dev=first.dev, ino=first.ino, offset=first.offset)
    assert [e.fault for e in make(log, resume=other_boot).poll()] == ["xid95"]
    other_file = Mark("b1", dev=first.dev, ino=(first.ino or 0) + 1, offset=first.offset)
    assert len(make(log, resume=other_file).poll()) == 2
    log.write_text(XID95)  # truncated and rewritten: shorter than the mark
    assert first.offset is not None
    assert first.offset > len(XID95)
    assert [e.fault for e in make(log, resume=first).poll()] == ["xid95"]


def test_a_first_read_skips_the_faults_of_earlier_boots_in_a_syslog_file(
    tmp_path: Path, make: Make, logs: list[str]
) -> None:
    log = tmp_path / "kern.log"
    boot = "Dec  1 {} gpu-n3 kernel: [    0.000000] Linux version 6.1.0-18-amd64 (debian)\n"
    xid = "Dec  1 {} gpu-n3 kernel: [ {:.6f}] " + XID79
    log.write_text(boot.format("01:00:00") + xid.format("03:00:00", 7200.0)
                   + xid.format("03:00:01", 7201.0) + boot.format("05:00:00")
                   + xid.format("06:00:00", 3600.0))  # fmt: skip
    f = make(log)
    (event,) = f.poll()  # this boot's fault only
    this_boot = parse_line(xid.format("06:00:00", 3600.0))
    assert this_boot is not None
    assert event.id == kmsg_event_id("gpu-n3", "b1", this_boot)
    assert any("skipped 2 fault line(s) of earlier boots" in line for line in logs)
    with log.open("a") as out:  # later lines of this boot are news
        out.write(xid.format("07:00:00", 7200.0))
    assert len(f.poll()) == 1


def test_a_partial_line_waits_for_its_end(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    f = make(log)
    f.poll()
    _append(log, XID79[:30])
    assert f.poll() == []
    _append(log, XID79[30:])
    assert [e.fault for e in f.poll()] == ["xid79"]


def test_truncation_is_noticed_and_the_file_reread(
    tmp_path: Path, make: Make, logs: list[str]
) -> None:
    log = tmp_path / "kmsg"
    log.write_text("x" * 500 + "\n")
    f = make(log, from_start=False)
    f.poll()
    with log.open("w") as out:  # copytruncate
        out.write(XID95)
    assert [e.fault for e in f.poll()] == ["xid95"]
    assert any("truncated" in line for line in logs)


def test_rotation_finishes_the_old_file_then_reads_the_new(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    f = make(log)
    f.poll()
    _append(log, XID79)
    os.rename(log, tmp_path / "kmsg.1")
    assert f.poll() != []  # the old file is still read while no new one exists
    _append(tmp_path / "kmsg.1", XID79.replace("pid=1234", "pid=1"))  # written before the switch
    log.write_text(XID95)
    assert [e.fault for e in f.poll()] == ["xid79", "xid95"]
    _append(log, XID79)
    assert [e.fault for e in f.poll()] == ["xid79"]


def test_a_file_that_appears_later_is_read_from_its_start(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    f = make(log)
    assert f.poll() == []
    log.write_text(XID79)
    assert [e.fault for e in f.poll()] == ["xid79"]


def test_bus_map_fills_the_accelerator(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    f = make(log, buses=bus_map([(5, "00000000:3B:00.0")]))
    f.poll()
    _append(log, XID79)
    (event,) = f.poll()
    assert event.accelerator == 5


def test_restart_rereads_give_the_same_ids(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text("[100.000001] " + XID79 + "[100.000002] " + XID79)
    first = [e.id for e in make(log, from_start=True).poll()]
    again = [e.id for e in make(log, from_start=True).poll()]
    assert first == again
    assert len(set(first)) == 2


def test_run_emits_until_stopped(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    f = make(log)
    got: list[HealthEvent] = []
    stop = threading.Event()

    def emit(event: HealthEvent, mark: Mark) -> None:
        assert mark.offset is not None
        got.append(event)

    t = threading.Thread(target=f.run, args=(emit, stop), kwargs={"interval_s": 0.01})
    t.start()
    try:
        wait_for(lambda: f._started, "the follower to open the file")
        _append(log, XID95)
        wait_for(lambda: len(got) == 1, "the event")
    finally:
        stop.set()
        t.join(timeout=10)
    assert not t.is_alive()
    assert got[0].fault == "xid95"


@pytest.mark.parametrize(
    "fault",
    ["xid79", "xid95", "xid48", "xid154", "xid31", "xid999", "gpu-lost", "gpu-reset-required"],
)
def test_written_fault_lines_parse_back(
    tmp_path: Path, clock: FakeClock, make: Make, fault: str
) -> None:
    log = tmp_path / "kmsg"
    f = make(log, buses=bus_map([(1, "00000000:3B:00.0")]))
    assert f.poll() == []  # no file yet: the writer creates it
    written = append_fault_line(
        log, fault, "00000000:3B:00.0", clock=clock, pid=42, process="train"
    )
    clock.advance(1)
    append_fault_line(log, fault, "0000:3b:00", clock=clock)
    events = f.poll()
    want = "xid79" if fault == "gpu-lost" else fault
    assert [e.fault for e in events] == [want, want]
    assert [e.accelerator for e in events] == [1, 1]
    assert [e.bus_id for e in events] == ["00000000:3B:00.0"] * 2
    assert events[0].id != events[1].id
    assert written.endswith("\n")
    parsed = parse_line(written)
    assert parsed is not None
    if fault.startswith("xid"):
        assert (parsed.pid, parsed.process) == (42, "train")


def test_an_sxid_is_written_for_the_switch_and_read_back_as_one() -> None:
    line = format_fault_line("sxid24007", "0000:c5:00.0")
    parsed = parse_line(line)
    assert parsed is not None
    assert (parsed.fault, parsed.bus_id, parsed.driver_action) == (
        "sxid24007", "00000000:C5:00.0", None
    )  # fmt: skip


def test_writer_refuses_faults_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="xid<N>, sxid<N>, gpu-lost or gpu-reset-required"):
        format_fault_line("ecc-uncorrected", "0000:3b:00")


def _kmsg_unreadable() -> str | None:
    try:
        os.close(os.open(DEV_KMSG, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as e:
        return f"needs a readable /dev/kmsg: {e}"
    return None


@pytest.mark.skipif(_kmsg_unreadable() is not None, reason=str(_kmsg_unreadable()))
def test_the_real_dev_kmsg_is_read_record_by_record(clock: FakeClock, make: Make) -> None:
    """Read-only: the whole ring buffer from the start; a resumed read skips what the mark
    covers; from the end, nothing."""
    everything = make(DEV_KMSG)
    everything.poll()  # no error; faults on this machine, if any, would be events
    assert everything._cur is not None
    assert everything._cur.is_char_device
    fd = os.open(DEV_KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        first = os.read(fd, 8192)
    finally:
        os.close(fd)
    seq = int(first.split(b",")[1])
    resumed = make(DEV_KMSG, resume=Mark("b1", seq=seq))
    resumed._cur = resumed._open(at_end=False)
    assert resumed._cur is not None
    records = resumed._read_records(resumed._cur)
    assert records, "the ring buffer holds more than one record"
    assert all(s > seq for _, s in records)  # the mark's record and those before are skipped
    at_end = make(DEV_KMSG, from_start=False)
    assert at_end.poll() == []
