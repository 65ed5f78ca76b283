"""The straggler rule (recovery/progress/straggler.py) on records of literal step times: a
process persistently slower than its peers at its own share of each step is named, with its
slowdown and what it cost; a moment's hiccup, equal processes and microseconds are not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recovery.errors import UsageError
from recovery.progress import Phase, Record
from recovery.progress.straggler import Straggler, StragglerConfig, StragglerWatch


def _record(rank: int, steps: int, total: float, step_s: float = 0.5) -> Record:
    return Record(
        pid=100 + rank, rank=rank, size=4, node=f"node{rank + 1}", phase=Phase.steps,
        phase_since=0.0, phase_budget_s=0.0, step_started=steps, step_finished=steps,
        step_started_at=0.0, step_finished_at=0.0, last_step_s=step_s, alive_at=0.0,
        compute_total_s=total, compute_steps=steps,
    )  # fmt: skip


def _run(watch: StragglerWatch, per_step: dict[int, list[float]]) -> list[Straggler | None]:
    """One look a step; ``per_step[rank][i]``: its work in step i+1. The verdicts."""
    totals = dict.fromkeys(per_step, 0.0)
    out: list[Straggler | None] = []
    for i in range(len(next(iter(per_step.values())))):
        for rank, times in per_step.items():
            totals[rank] += times[i]
        out.append(watch.observe({r: _record(r, i + 1, t) for r, t in totals.items()}))
    return out


def test_a_persistently_slow_process_is_named_with_its_slowdown_and_cost() -> None:
    slow_from = 30
    times = {r: [0.1] * 60 for r in range(4)}
    times[1] = [0.1] * slow_from + [0.4] * 30  # a 25 % CPU quota from step 31
    verdicts = _run(StragglerWatch(), times)
    first = next(i for i, v in enumerate(verdicts) if v is not None)
    assert slow_from < first + 1 <= slow_from + 20  # within a window of it starting
    found = verdicts[-1]
    assert found is not None
    assert (found.rank, found.node, found.pid) == (1, "node2", 101)
    assert found.slowdown == pytest.approx(4.0)
    assert found.peers_s == pytest.approx(0.1)
    # About 0.3 s a step since it went slow (30 steps): about 9 s, give or take a window.
    assert 5.0 <= found.lost_s <= 16.0
    assert "rank 1 on node2 does its share of a step in 0.400 s" in found.describe()


@pytest.mark.parametrize(
    "slow",
    [
        [0.1] * 40,  # equal
        [0.1] * 20 + [0.5] * 3 + [0.1] * 17,  # a hiccup of three steps in a window
        [0.1, 0.13] * 20,  # uneven, and never 1.5x
    ],
)
def test_equal_processes_and_hiccups_are_no_straggler(slow: list[float]) -> None:
    times = {0: [0.1] * 40, 1: slow, 2: [0.1] * 40}
    assert [v for v in _run(StragglerWatch(), times) if v is not None] == []


def test_milliseconds_are_noise_whatever_the_ratio() -> None:
    times = {0: [0.001] * 40, 1: [0.008] * 40, 2: [0.001] * 40}  # 8x, but 7 ms
    assert [v for v in _run(StragglerWatch(), times) if v is not None] == []
    found = _run(StragglerWatch(StragglerConfig(min_excess_s=0.0)), times)[-1]
    assert found is not None


def test_it_must_persist_over_looks() -> None:
    times = {r: [0.1] * 40 for r in range(3)}
    times[2] = [0.3] * 40
    verdicts = _run(StragglerWatch(StragglerConfig(persist=5)), times)
    first = next(i for i, v in enumerate(verdicts) if v is not None)
    assert first == 20 + 4  # the first full window (steps 1 to 21), then four more looks


def test_a_single_process_or_one_that_reports_no_work_is_not_judged() -> None:
    watch = StragglerWatch()
    assert _run(watch, {0: [0.5] * 40}) == [None] * 40
    plain = {r: replace(_record(r, 30, 0.0), compute_steps=0) for r in range(3)}
    assert watch.observe(plain) is None


@pytest.mark.parametrize(
    "kw", [{"factor": 1.0}, {"window_steps": 1}, {"persist": 0}, {"min_excess_s": -1}]
)
def test_bad_thresholds_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        StragglerConfig(**kw)  # type: ignore[arg-type]


def test_what_the_job_loses_a_step_is_its_step_time_over_the_healthy_one_when_more() -> None:
    """A throttled process is slow at more than its timed share (the update after the
    exchange, its batches): its share grew by 0.2 s, the job's step by 0.75 s. The move is
    reckoned on the 0.75 s."""
    watch = StragglerWatch(StragglerConfig(swap=True, until_step=200, swap_cost_s=60))
    totals = dict.fromkeys(range(4), 0.0)
    found = None
    for step in range(1, 71):
        slow = step > 30
        for r in totals:
            totals[r] += 0.3 if (slow and r == 1) else 0.1
        step_s = 1.0 if slow else 0.25
        found = watch.observe({r: _record(r, step, t, step_s) for r, t in totals.items()})
    assert found is not None
    assert found.step_s - found.peers_s == pytest.approx(0.2)
    assert (found.job_step_s, found.healthy_step_s) == (1.0, 0.25)
    assert found.excess_s == pytest.approx(0.75)
    assert "the job's step takes 1.000 s against 0.250 s before" in found.describe()
    move, why = watch.config.requeue_swap(found)
    assert move, why  # 0.75 s x 130 steps left; 0.2 s x 130 = 26 s would not pay
