"""The local daemons' waits run on the clock they are given: a fake clock that jumps past the
deadline ends them at once (on the real clock these tests would wait 10 and 30 seconds)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from recovery.errors import CoordinatorUnavailableError
from recovery.proc import alive
from recovery.statedir import write_endpoint
from service.daemons import agents as agents_proc
from service.daemons import coordinator as coordinator_proc


def jumping_clock(reads: list[float]) -> Callable[[], float]:
    """0 on the first read, an hour later on every other; each read recorded in ``reads``."""
    values = itertools.chain([0.0], itertools.repeat(3600.0))

    def clock() -> float:
        reads.append(next(values))
        return reads[-1]

    return clock


def test_agents_that_never_connect_time_out_on_the_given_clock(tmp_path: Path) -> None:
    # An agent recorded as running (this very process): none is started.
    (tmp_path / agents_proc.AGENTS_FILE).write_text(json.dumps({"node1": os.getpid()}))
    reads: list[float] = []
    with pytest.raises(CoordinatorUnavailableError, match=r"not connected within 30 s"):
        agents_proc.start_agents(
            tmp_path, ["node1"], "http://127.0.0.1:1", connected=set,
            clock=jumping_clock(reads), sleep=lambda _s: None,
        )  # fmt: skip
    assert reads == [0.0, 3600.0]


def test_a_coordinator_that_ignores_sigterm_is_killed_after_the_grace_on_the_given_clock(
    tmp_path: Path,
) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"  # SIGTERM is ignored from here on
        write_endpoint(tmp_path, "http://127.0.0.1:1", child.pid)
        reads: list[float] = []
        assert coordinator_proc.stop(tmp_path, clock=jumping_clock(reads))
        assert reads == [0.0, 3600.0]
        assert not alive(child.pid)
