"""The kernel-log follower on real files: from the end, appends, partial lines, truncation,
rotation, a file that appears later, a stop event; and the fault-line writer round trip."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.follow import DEV_KMSG, KmsgFollower, append_fault_line, format_fault_line
from agents.kmsg import bus_map, parse_line
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


def test_starts_at_the_end_and_reads_only_new_lines(
    tmp_path: Path, clock: FakeClock, make: Make
) -> None:
    log = tmp_path / "kmsg"
    log.write_text(XID79)  # already there: the previous agent's business
    f = make(log)
    assert f.poll() == []
    _append(log, "[1.0] usb 1-1: new device\n" + XID95)
    clock.advance(5)
    (event,) = f.poll()
    assert event.fault == "xid95"
    assert event.observed_at == clock.now().wall
    assert f.poll() == []


def test_from_start_reads_what_is_already_there(tmp_path: Path, make: Make) -> None:
    log = tmp_path / "kmsg"
    log.write_text(XID79 + XID95)
    f = make(log, from_start=True)
    assert [e.fault for e in f.poll()] == ["xid79", "xid95"]


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
    f = make(log)
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
    t = threading.Thread(target=f.run, args=(got.append, stop), kwargs={"interval_s": 0.01})
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
    "fault", ["xid79", "xid95", "xid48", "xid154", "xid31", "xid999", "gpu-lost"]
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
    assert events[0].id != events[1].id
    assert written.endswith("\n")
    parsed = parse_line(written)
    assert parsed is not None
    if fault != "gpu-lost":
        assert (parsed.pid, parsed.process) == (42, "train")


def test_writer_refuses_faults_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="xid<N> or gpu-lost"):
        format_fault_line("ecc-uncorrected", "0000:3b:00")


def _kmsg_unreadable() -> str | None:
    try:
        os.close(os.open(DEV_KMSG, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as e:
        return f"needs a readable /dev/kmsg: {e}"
    return None


@pytest.mark.skipif(_kmsg_unreadable() is not None, reason=str(_kmsg_unreadable()))
def test_the_real_dev_kmsg_is_read_record_by_record(clock: FakeClock, make: Make) -> None:
    """Read-only: the whole ring buffer from the start, then nothing new from the end."""
    everything = make(DEV_KMSG, from_start=True)
    everything.poll()  # no error; faults on this machine, if any, would be events
    at_end = make(DEV_KMSG)
    before = at_end.poll()
    assert all(e.source == "kmsg" for e in before)
    assert at_end._cur is not None
    assert at_end._cur.is_char_device
