"""The journald source against a fake ``journalctl`` on PATH (fake_journalctl.py, which serves
real-format entries from samples/journal.json and behaves as the real one does for what the
source asks), and against the real journald when one runs here (root only; skipped
otherwise, with the reason)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agents.journald import JournaldSource
from agents.readmark import Mark
from recovery.model import HealthEvent
from recovery.ports.clock import FakeClock
from tests.agents.helpers import wait_for
from tests.agents.live import AgentProcess, LiveCoordinator

SAMPLES = Path(__file__).parent / "samples"
FAKE = Path(__file__).parent / "fake_journalctl.py"
BOOT = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # the boot of samples/journal.json
KERNEL_FAULTS = ["xid48", "xid79", "xid79", "xid95", "sxid24007", "gpu-reset-required"]


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A journal of real-format entries, served by the fake ``journalctl`` put first on
    PATH for this test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "journalctl"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    path = tmp_path / "journal.jsonl"
    shutil.copy(SAMPLES / "journal.json", path)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_JOURNAL", str(path))
    monkeypatch.setenv("FAKE_BOOT_ID", BOOT)
    return path


Got = list[tuple[HealthEvent, Mark]]


@pytest.fixture
def running(clock: FakeClock) -> Iterator[Callable[..., tuple[JournaldSource, Got, list[str]]]]:
    """``running(**options)``: a journald source in a thread, what it emitted, its log."""
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(**kw: object) -> tuple[JournaldSource, Got, list[str]]:
        logs: list[str] = []
        kw.setdefault("boot_id", BOOT)
        source = JournaldSource(node="gpu-n3", clock=clock, log=logs.append, **kw)  # type: ignore[arg-type]
        got: Got = []
        stop = threading.Event()
        thread = threading.Thread(target=source.run, args=(lambda e, m: got.append((e, m)), stop))
        thread.start()
        stops.append((stop, thread))
        return source, got, logs

    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the journald source did not stop"


def _runs(journal: Path) -> list[dict[str, object]]:
    """Every start of the fake journalctl: its pid and arguments."""
    path = Path(f"{journal}.starts")
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _starts(journal: Path) -> list[list[str]]:
    return [list(run["argv"]) for run in _runs(journal)]  # type: ignore[call-overload]


def test_the_command_line_asks_for_the_kernel_log_of_this_boot(clock: FakeClock) -> None:
    base = ["journalctl", "-k", "-f", "-o", "json", "--no-pager"]
    assert JournaldSource("n1", BOOT, clock).argv() == [*base, "-n", "all"]
    assert JournaldSource("n1", BOOT, clock, from_start=False).argv() == [*base, "-n", "0"]
    ours = Mark(BOOT, cursor="s=1;i=2")
    assert JournaldSource("n1", BOOT, clock, resume=ours).argv() == [
        *base, "--after-cursor=s=1;i=2"
    ]  # fmt: skip
    theirs = Mark("another-boot", cursor="s=1;i=2")
    assert JournaldSource("n1", BOOT, clock, resume=theirs).argv() == [*base, "-n", "all"]


def test_the_whole_boot_is_read_kernel_lines_only_each_with_its_cursor(
    journal: Path, running: Callable[..., tuple[JournaldSource, Got, list[str]]]
) -> None:
    _, got, _ = running()
    wait_for(lambda: len(got) == len(KERNEL_FAULTS), "the sample journal's kernel faults")
    assert [e.fault for e, _ in got] == KERNEL_FAULTS
    cursors = [json.loads(ln)["__CURSOR"] for ln in journal.read_text().splitlines()]
    assert [m.cursor for _, m in got] == [cursors[i] for i in (2, 4, 5, 6, 7, 8)]
    assert all(m.boot_id == BOOT for _, m in got)
    assert _starts(journal)[0][:4] == ["-k", "-f", "-o", "json"]


def test_lines_appended_later_are_followed(
    journal: Path, running: Callable[..., tuple[JournaldSource, Got, list[str]]]
) -> None:
    _, got, _ = running()
    wait_for(lambda: len(got) == len(KERNEL_FAULTS), "the boot so far")
    _append(journal, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.")
    wait_for(lambda: len(got) == len(KERNEL_FAULTS) + 1, "the appended line")
    assert got[-1][0].fault == "xid79"


def test_a_restart_goes_on_after_the_saved_cursor(
    journal: Path, running: Callable[..., tuple[JournaldSource, Got, list[str]]]
) -> None:
    _, got, _ = running()
    wait_for(lambda: len(got) == len(KERNEL_FAULTS), "the first run")
    saved = got[2][1]  # the third fault's line was the last one settled
    _, again, _ = running(resume=saved)
    wait_for(lambda: len(again) == 3, "the faults after the mark")
    assert [e.fault for e, _ in again] == KERNEL_FAULTS[3:]
    assert [e.id for e, _ in again] == [e.id for e, _ in got[3:]]  # same lines, same ids


def test_a_cursor_the_journal_no_longer_has_reads_the_boot_again(
    journal: Path, running: Callable[..., tuple[JournaldSource, Got, list[str]]]
) -> None:
    _, got, logs = running(resume=Mark(BOOT, cursor="s=gone;i=1"))
    wait_for(lambda: len(got) == len(KERNEL_FAULTS), "the boot read again", timeout_s=20)
    assert any("Failed to seek to cursor" in line for line in logs)
    assert [a[-1] for a in _starts(journal)] == ["--after-cursor=s=gone;i=1", "all"]


def test_journalctl_exiting_is_restarted_after_the_last_entry_read(
    journal: Path, running: Callable[..., tuple[JournaldSource, Got, list[str]]]
) -> None:
    _, got, logs = running()
    wait_for(lambda: len(got) == len(KERNEL_FAULTS), "the boot so far")
    (run,) = _runs(journal)
    os.kill(int(run["pid"]), signal.SIGTERM)  # type: ignore[call-overload]  # ours, by pid
    wait_for(lambda: any("exited" in line for line in logs), "the source to notice")
    wait_for(lambda: len(_starts(journal)) == 2, "journalctl started again", timeout_s=20)
    assert _starts(journal)[1][-1].startswith("--after-cursor=")
    _append(journal, "NVRM: Xid (PCI:0000:86:00): 64, pid=1, name=x, Row Remapping: Failed.")
    wait_for(lambda: len(got) == len(KERNEL_FAULTS) + 1, "a line after the restart")
    assert [e.fault for e, _ in got[len(KERNEL_FAULTS) :]] == ["xid64"]  # nothing repeated


@pytest.mark.slow
def test_an_agent_reads_the_journal_and_a_restart_repeats_nothing(
    journal: Path, live: LiveCoordinator, agents: Callable[..., AgentProcess]
) -> None:
    first = agents("n1", sources="journald", kmsg_from="auto")
    # The fall-off-the-bus message and the XID 79 of the same GPU are one fault: the second is
    # folded into the first's deduplication window, and its summary leaves at the SIGTERM.
    folded = [f for i, f in enumerate(KERNEL_FAULTS) if i != 2]
    wait_for(lambda: len(live.stored_ids()) == len(folded), "the journal's faults", 30)
    wait_for(lambda: (first.spool / ".journald-mark.json").exists(), "the read mark")
    wait_for(first.spool_empty, "the acknowledgements")
    assert first.terminate() == 0
    assert [(e.fault, e.count) for e in live.stored()] == [(f, 1) for f in folded] + [
        ("xid79", 1)
    ]  # fmt: skip
    agents("n1", sources="journald", kmsg_from="auto")
    wait_for(lambda: len(_starts(journal)) == 2, "the second agent's journalctl", 30)
    assert _starts(journal)[1][-1].startswith("--after-cursor=")
    _append(journal, "NVRM: Xid (PCI:0000:86:00): 64, pid=1, name=x, Row Remapping: Failed.")
    wait_for(lambda: len(live.stored_ids()) == len(folded) + 2, "the new line", 30)
    assert live.stored()[-1].fault == "xid64"
    assert live.duplicates() == 0, "a restart sent a line again"


def test_without_journalctl_one_line_says_so_and_the_source_stops(clock: FakeClock) -> None:
    logs: list[str] = []
    source = JournaldSource("n1", BOOT, clock, command=("/nonexistent/journalctl",),
                            log=logs.append)  # fmt: skip
    source.run(lambda e, m: None, threading.Event())  # returns at once
    assert logs == ["journald: /nonexistent/journalctl not found (no journald here?); "
                    "source stopped"]  # fmt: skip


def _append(journal: Path, message: str) -> None:
    entry = {"_TRANSPORT": "kernel", "_BOOT_ID": BOOT, "SYSLOG_IDENTIFIER": "kernel",
             "MESSAGE": message, "__CURSOR": f"s=test;i={uuid.uuid4().hex}"}  # fmt: skip
    with journal.open("a") as f:
        f.write(json.dumps(entry) + "\n")


def _journald_running() -> str | None:
    if os.geteuid() != 0:
        return "needs root (writes a line into the kernel log)"
    if shutil.which("journalctl") is None:
        return "no journalctl here"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect("/run/systemd/journal/socket")  # refused when no journald listens
    except OSError:
        return "no journald runs here"
    finally:
        probe.close()
    return None


@pytest.mark.journald
@pytest.mark.skipif(_journald_running() is not None, reason=str(_journald_running()))
def test_the_real_journald_serves_a_kernel_line_written_to_dev_kmsg(
    running: Callable[..., tuple[JournaldSource, Got, list[str]]],
) -> None:
    """A line written to /dev/kmsg by a program: journald stores it under the kernel
    transport, its "NVRM" prefix taken for a program's name; the source puts it back."""
    from agents.ids import read_boot_id

    marker = uuid.uuid4().hex[:12]
    _, got, _ = running(boot_id=read_boot_id())  # the whole boot: no race with the write
    line = (f"<4>NVRM: Xid (PCI:0000:fe:00): 999, pid='<unknown>', name=<unknown>, "
            f"recover test line [recover-test {marker}]\n")  # fmt: skip
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(line)
    wait_for(lambda: any(marker in e.message for e, _ in got), "the line via journald", 20)
    (event,) = [e for e, _ in got if marker in e.message]
    assert (event.fault, event.bus_id) == ("xid999", "00000000:FE:00.0")
