"""Crash consistency of the spool: every event it confirmed is there after a restart, once.

* in-process: a stand-in for ``os`` aborts a put (and an ack) at its n-th system call, for
  every n, and a fresh spool on the same directory is inspected;
* real processes: a child spools and acknowledges in a loop and is SIGKILLed at seeded random
  moments; everything it reported as spooled and not acknowledged must be there, exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import spool as spool_mod
from agents.spool import Spool
from tests.agents.helpers import make_event
from tests.helpers import Crash, CrashingOs, kill_and_drain

CHILD = Path(__file__).with_name("spool_child.py")
ROOT = Path(__file__).resolve().parents[2]


def _count_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str) -> int:
    spool = Spool(tmp_path / "count")
    spool.put(make_event(0))
    counter = CrashingOs(at=None)
    with monkeypatch.context() as mp:
        mp.setattr(spool_mod, "os", counter)
        if op == "put":
            spool.put(make_event(1))
        else:
            spool.ack(make_event(0).id)
    return counter.calls


def test_every_crash_point_of_a_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    total = _count_calls(tmp_path, monkeypatch, "put")
    assert total >= 6  # open, write, fsync, close, rename, open dir, fsync dir, close
    outcomes = set()
    for at in range(total):
        spool = Spool(tmp_path / f"crash{at}")
        spool.put(make_event(0))
        with monkeypatch.context() as mp:
            mp.setattr(spool_mod, "os", CrashingOs(at))
            with pytest.raises(Crash):
                spool.put(make_event(1))

        after = Spool(spool.directory)  # "restart"
        ids = [s.event.id for s in after.pending()]
        assert ids[0] == make_event(0).id, f"crash at #{at} lost a confirmed event"
        assert ids in ([make_event(0).id], [make_event(0).id, make_event(1).id]), ids
        if len(ids) == 2:
            assert after.pending()[1].event == make_event(1), f"crash at #{at}: torn event"
        assert sorted(p.name for p in after.directory.iterdir()) == [
            f"{s.seq:016d}.json" for s in after.pending()
        ], "leftovers after restart"
        outcomes.add(len(ids))
        assert after.put(make_event(2))
    assert outcomes == {1, 2}, "the crash points should straddle the commit"


def test_every_crash_point_of_an_ack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    total = _count_calls(tmp_path, monkeypatch, "ack")
    assert total >= 3
    for at in range(total):
        spool = Spool(tmp_path / f"crash{at}")
        spool.put(make_event(0))
        spool.put(make_event(1))
        with monkeypatch.context() as mp:
            mp.setattr(spool_mod, "os", CrashingOs(at))
            with pytest.raises(Crash):
                spool.ack(make_event(0).id)
        after = Spool(spool.directory)
        ids = [s.event.id for s in after.pending()]
        # The acknowledged one may come back (sent again, acknowledged again); the other stays.
        assert ids[-1] == make_event(1).id, f"crash at #{at} lost an unacknowledged event"
        assert len(ids) == len(set(ids))


# --- real processes, SIGKILLed ---------------------------------------------------------------


def _read(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"child exited early with status {proc.returncode}:\n{err}")
    return line.split()


def _kill_loop(directory: Path, kills: int, seed: int) -> int:
    """SIGKILL a spooling child ``kills`` times; check the spool after each kill.

    Returns how many events were confirmed in all."""
    rng = random.Random(seed)
    confirmed: set[str] = set()  # reported spooled, no acknowledgement begun
    acked: set[str] = set()  # an acknowledgement begun: it may be there or not
    done: set[str] = set()  # acknowledged: gone for good (a kill does not undo an unlink)

    def record(word: str, event_id: str) -> None:
        assert word in ("spooled", "acking", "acked"), word
        (confirmed if word == "spooled" else acked).add(event_id)
        if word == "acked":
            done.add(event_id)

    started = 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for kill in range(kills):
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(started)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            word, _ = _read(proc)
            assert word == "ready"
            for _ in range(rng.choice([0, 1, 3, 10, 30])):
                record(*_read(proc))
            time.sleep(rng.uniform(0.0, 0.03))
        finally:
            out, err = kill_and_drain(proc)
        assert proc.returncode == -signal.SIGKILL, err
        # Lines printed after the last one we read. A kill can cut the last one short: such
        # an event was never reported as spooled, so it is not counted as confirmed.
        complete = out if out.endswith("\n") else out[: out.rfind("\n") + 1]
        for line in complete.splitlines():
            record(*line.split())
        confirmed -= acked

        spool = Spool(directory)
        ids = [s.event.id for s in spool.pending()]
        assert len(ids) == len(set(ids)), f"kill {kill}: an event is spooled twice"
        missing = confirmed - set(ids)
        assert not missing, f"kill {kill}: confirmed events lost: {sorted(missing)[:5]}"
        assert not done & set(ids), f"kill {kill}: acknowledged events came back"
        assert not list(directory.glob(".tmp-*"))
        for s in spool.pending():  # content intact
            n = int(s.event.id.rsplit(":", 1)[1])
            assert s.event == make_event(n, size=200 + n % 300)
        # The next child carries on after the highest number any child may have started.
        started = max([started, *(int(i.rsplit(":", 1)[1]) + 1 for i in ids + sorted(acked))])
        started += 1
    return len(confirmed | acked)


@pytest.mark.slow
def test_sigkill_while_spooling_never_loses_a_confirmed_event(tmp_path: Path) -> None:
    assert _kill_loop(tmp_path / "spool", kills=8, seed=4321) > 10


@pytest.mark.slow
@pytest.mark.soak
def test_sigkill_while_spooling_many_times(tmp_path: Path) -> None:
    assert _kill_loop(tmp_path / "spool", kills=60, seed=77) > 100
