"""The agent's ``progress`` source and a slow node: the agent of the process whose own work
per step is persistently slower than its peers' reports ``node-slow`` once, naming the
slowdown and its cost; the other agents and a job of equal processes report nothing.
In-process progress writers on a fake clock (the rule itself: tests/unit/progress)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.progress import ProgressSource
from recovery.model import HealthEvent, Source
from recovery.ports.clock import FakeClock
from recovery.progress import ProgressWriter, write_job_budgets
from recovery.progress.stacks import mark_supervised

NODES = ("node1", "node2", "node3")


def _slow_job(
    tmp_path: Path,
    slow_rank: int | None,
    steps: int = 60,
    site: dict[str, Any] | None = None,
    ramp_at: int | None = None,
) -> list[HealthEvent]:
    """Three processes on three nodes, ``slow_rank``'s work 4x its peers' from step 20 (2x
    until ``ramp_at``, when given); every agent's events. ``site``: the coordinator's progress
    thresholds, given to each."""
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
    for source in sources:
        source.use_site_budgets(site or {})
    events = []
    for step in range(1, steps + 1):
        clock.advance(0.5)
        for r, w in enumerate(writers):
            slow = r == slow_rank and step > 20
            ramping = ramp_at is not None and step < ramp_at
            w.step_finished(step, compute_s=(0.2 if ramping else 0.4) if slow else 0.1)
            w.alive()
        events += [e for s in sources for e in s.tick()]
    for w in writers:
        w.close()
    return events


@pytest.mark.parametrize("slow_rank", [1, None])
def test_the_slow_processs_own_agent_reports_it_once(tmp_path: Path, slow_rank: int | None) -> None:
    directory = tmp_path / "progress"
    events = _slow_job(tmp_path, slow_rank)
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


@pytest.mark.parametrize(
    ("rule", "supervised", "fault", "said"),
    [
        # 0.3 s lost a step over the ~970 steps left: about 290 s, more than a 60 s move.
        ({"swap": True, "until_step": 1000}, False, "node-slow-swap", "moving the job saves"),
        # A short job: the 30 steps left would save about 9 s.
        ({"swap": True, "until_step": 60 + 30}, False, "node-slow", "not more than a move"),
        ({"swap": True}, False, "node-slow", "the steps left are not known"),
        ({"swap": True, "until_step": 1000}, True, "node-slow", "its supervisor moves it"),
        ({"until_step": 1000}, False, "node-slow", ""),
    ],
)
def test_a_job_that_asked_to_be_moved_off_a_straggler_is_when_it_pays(
    tmp_path: Path, rule: dict[str, object], supervised: bool, fault: str, said: str
) -> None:
    directory = tmp_path / "progress"
    write_job_budgets(directory, {"straggler": rule})
    if supervised:
        mark_supervised(directory, "node1 pid 1")
    (event,) = _slow_job(tmp_path, 1)
    assert (event.node, event.fault) == ("node2", fault)
    if said:
        assert said in event.message
    else:  # reports only: nothing about a move
        assert "move" not in event.message


def test_the_sites_thresholds_from_the_coordinator_judge_the_jobs(tmp_path: Path) -> None:
    """The policy file's ``progress`` reaches the agents with their heartbeats: a site that
    calls a process slow only at 5x its peers hears nothing of a 4x one; a job's own budgets
    still go over the site's."""
    assert _slow_job(tmp_path / "a", 1, site={"straggler": {"factor": 5.0}}) == []
    (tmp_path / "b" / "progress").mkdir(parents=True)
    write_job_budgets(tmp_path / "b" / "progress", {"straggler": {"factor": 3.0}})
    (event,) = _slow_job(tmp_path / "b", 1, site={"straggler": {"factor": 5.0}})
    assert event.fault == "node-slow"
    logged: list[str] = []
    source = ProgressSource("n", FakeClock(), tmp_path / "r", log=logged.append)
    source.use_site_budgets({"straggler": {"factor": 0.5}})
    assert source.budgets.straggler.factor == 1.5  # refused: the agent's own kept
    assert "straggler factor must be > 1" in logged[0]


def test_a_move_that_did_not_pay_at_first_is_asked_for_once_it_does(tmp_path: Path) -> None:
    """Found at 2x, the move would save too little; at 4x it pays: node-slow first, then one
    node-slow-swap, and nothing more."""
    directory = tmp_path / "progress"
    write_job_budgets(
        directory, {"straggler": {"swap": True, "until_step": 200, "swap_cost_s": 20}}
    )
    events = _slow_job(tmp_path, 1, steps=120, ramp_at=60)
    assert [(e.node, e.fault) for e in events] == [
        ("node2", "node-slow"),
        ("node2", "node-slow-swap"),
    ]
    assert "not more than a move costs" in events[0].message
    assert "moving the job saves about" in events[1].message
    assert events[0].id != events[1].id
