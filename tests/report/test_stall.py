"""The stall of a K-process job (fault -> every process stopped) and the chain it leads, on
literal event lines: process 0 killed by the fault, the others ending on ``peer-lost``; and
goodput counted over the K processes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from recovery.report.goodput import goodput, goodput_ranks
from recovery.report.phases import _stopped, _stopped_alone
from recovery.report.processes import Process, split_processes
from recovery.report.run import parse_events

FAULT = 10.2


def _rank(*tail: dict[str, Any], restart: bool = True) -> list[Process]:
    """One rank's runs: started at 0, updates 1..10 at t=1..10, then ``tail``, then (with
    ``restart``) a second run from t=30 that completes."""
    events: list[dict[str, Any]] = [{"event": "started", "ts": 0.0, "step": None}]
    events += [{"event": "step", "ts": float(s), "step": s, "step_s": 0.5} for s in range(1, 11)]
    events += tail
    if restart:
        events += [
            {"event": "started", "ts": 30.0, "step": None},
            {"event": "restored", "ts": 30.5, "step": 10, "restore_s": 0.1},
            {"event": "step", "ts": 31.0, "step": 11, "step_s": 0.5},
            {"event": "completed", "ts": 31.5, "step": 11},
        ]
    return split_processes(parse_events([json.dumps(e) + "\n" for e in events]))


def _lost(at: float) -> dict[str, Any]:
    return {"event": "peer-lost", "ts": at, "step": 10, "lost_rank": 0, "exit_code": 76}


def test_the_stall_ends_when_the_last_rank_stopped_and_the_killed_one_counts_at_the_fault() -> None:
    ranks = [_rank(), _rank(_lost(10.9)), _rank(_lost(11.4)), _rank(_lost(10.7))]
    stopped = _stopped(ranks, FAULT)
    # Process 0 wrote nothing after its last update (t=10): it stopped at the fault.
    assert stopped == (FAULT, 10.9, 11.4, 10.7)
    assert _stopped_alone(ranks, FAULT)


def test_a_rank_ended_by_slurm_does_not_stop_on_its_own() -> None:
    # Rank 1 went on updating past the fault until Slurm killed it (no peer-lost line).
    late = {"event": "step", "ts": 12.0, "step": 11, "step_s": 0.5}
    ranks = [_rank(), _rank(late), _rank(_lost(11.0))]
    assert _stopped(ranks, FAULT) == (FAULT, 12.0, 11.0)
    assert not _stopped_alone(ranks, FAULT)


def test_a_job_that_ran_on_to_completion_has_no_stall() -> None:
    done = {"event": "completed", "ts": 11.0, "step": 10}
    assert _stopped([_rank(done, restart=False)], FAULT) == (None,)


def test_goodput_counts_every_process() -> None:
    ranks = [_rank(), _rank(_lost(10.9))]
    one = goodput(ranks[0], 0.0, 32.0)
    both = goodput_ranks(ranks, 0.0, 32.0)
    assert (both.processes, both.wall_s) == (2, 64.0)
    assert both.productive_s + sum(b.seconds for b in both.badput) == pytest.approx(64.0)
    assert both.productive_s == pytest.approx(2 * one.productive_s)
    assert both.goodput == pytest.approx(one.goodput)
