"""The journal's commit point: an event acknowledged by ``append_events`` survives the process
being SIGKILLed at any moment, and no event is ever stored twice.

A child appends events in a loop and reports each acknowledged batch; it is killed at seeded
random moments (between commits, inside one, while printing), then restarted a few events back,
as an agent resends what it has no acknowledgement for.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recovery.ports.clock import FakeClock
from service.journaldb.journal import SqliteJournal
from tests.helpers import kill_and_drain
from tests.service.helpers import crash_event

CHILD = Path(__file__).with_name("journal_crash_child.py")


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"child exited early with status {proc.returncode}:\n{err}")
    return line


def _acks(line: str) -> list[tuple[int, bool]]:
    word, *items = line.split()
    assert word == "acked", line
    return [(int(n), flag == "new") for n, flag in (item.split(":") for item in items)]


def _check(path: Path, acked: set[int], attempted: int, kill: int) -> int:
    journal = SqliteJournal(path, FakeClock())
    try:
        history = journal.history()
    finally:
        journal.close()
    ids = [s.event.id for s, _ in history]
    assert len(ids) == len(set(ids)), f"kill {kill}: an event was stored twice"
    assert [s.seq for s, _ in history] == list(range(1, len(ids) + 1))
    stored = {int(i.removeprefix("crash-")) for i in ids}
    assert acked <= stored, f"kill {kill}: acknowledged events lost: {sorted(acked - stored)}"
    assert max(stored, default=-1) < attempted, f"kill {kill}: an event never sent was stored"
    for s, _ in history:
        n = int(s.event.id.removeprefix("crash-"))
        assert s.event == crash_event(n), f"kill {kill}: event {n} changed"
    assert stored == set(range(len(stored))), "appends are in order, so what is stored is a prefix"
    return len(stored)


def _kill_loop(path: Path, kills: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    acked: set[int] = set()
    stored = duplicates = 0
    for kill in range(kills):
        start = max(0, stored - rng.randint(0, 6))  # resend a few: some are duplicates
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), str(start), str(seed + kill)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = []
        try:
            assert _line(proc).split() == ["ready"]
            for _ in range(rng.choice([0, 1, 3, 10, 40])):
                lines.append(_line(proc))
            time.sleep(rng.uniform(0.0, 0.02))
        finally:
            out, err = kill_and_drain(proc)
        assert proc.returncode == -signal.SIGKILL, err
        lines += [line for line in out.splitlines() if line.startswith("acked")]
        attempted = start
        for line in lines:
            for n, new in _acks(line):
                assert not (new and n in acked), f"kill {kill}: event {n} stored twice"
                duplicates += not new
                acked.add(n)
                attempted = max(attempted, n + 1)
        attempted += 8  # the batch in flight when the child died may be stored, unacked
        stored = _check(path, acked, attempted, kill)
    return len(acked), duplicates


@pytest.mark.slow
def test_sigkill_never_loses_an_acknowledged_event(tmp_path: Path) -> None:
    acked, duplicates = _kill_loop(tmp_path / "journal.db", kills=8, seed=4321)
    assert acked > 20, "the children should have committed something"
    assert duplicates > 0, "resends after a restart should have met stored events"


@pytest.mark.slow
@pytest.mark.soak
def test_sigkill_many_times(tmp_path: Path) -> None:
    acked, _ = _kill_loop(tmp_path / "journal.db", kills=40, seed=99)
    assert acked > 200
