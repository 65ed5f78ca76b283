"""The agent's ``progress`` source and a slow node: the agent of the process whose own work
per step is persistently slower than its peers' reports ``node-slow`` once, naming the
slowdown and its cost; the other agents and a job of equal processes report nothing.
In-process progress writers on a fake clock (the rule itself: tests/unit/progress)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.progress import ProgressSource
from recovery.model import Source
from recovery.ports.clock import FakeClock
from recovery.progress import ProgressWriter

NODES = ("node1", "node2", "node3")


@pytest.mark.parametrize("slow_rank", [1, None])
def test_the_slow_processs_own_agent_reports_it_once(tmp_path: Path, slow_rank: int | None) -> None:
    clock = FakeClock()
    directory = tmp_path / "progress"
    # Each node its own registry (entries are by pid, and these processes are this one).
    writers = [
        ProgressWriter(directory, rank=r, size=3, node=n, registry=tmp_path / n, job="9",
                       clock=lambda: clock.now().wall)
        for r, n in enumerate(NODES)
    ]  # fmt: skip
    sources = [
        ProgressSource(n, clock, tmp_path / n, stacks=lambda _pid: "", log=lambda _line: None)
        for n in NODES
    ]
    events = []
    for step in range(1, 61):
        clock.advance(0.5)
        for r, w in enumerate(writers):
            slow = r == slow_rank and step > 20
            w.step_finished(step, compute_s=0.4 if slow else 0.1)
            w.alive()
        events += [e for s in sources for e in s.tick()]
    for w in writers:
        w.close()
    if slow_rank is None:
        assert events == []
        return
    (event,) = events
    assert (event.node, event.fault, event.source) == ("node2", "node-slow", Source.progress)
    assert event.message.startswith(
        "job 9: rank 1 on node2 does its share of a step in 0.400 s against 0.100 s for its "
        "peers (4.0x, since step"
    )
    assert "the job has lost about" in event.message
    # Kept beside the records too, for the job's supervisor (it waits for it before a swap).
    kept = (directory / "slow" / "rank1.txt").read_text()
    assert kept.startswith("rank 1 pid ")
    assert event.message in kept
