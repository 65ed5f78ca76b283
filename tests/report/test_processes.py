"""The event log cut into processes, on literal lines (two restarts, the second one falling
back below what the first restart had redone)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from recovery.report.goodput import PRODUCTIVE, WASTED_PROGRESS, spans
from recovery.report.processes import kept_through, split_processes
from recovery.report.run import parse_events


def _lines(*events: dict[str, Any]) -> list[str]:
    return [json.dumps(e) + "\n" for e in events]


def _steps(first: int, last: int, t0: float) -> list[dict[str, Any]]:
    """Updates ``first..last``, one per second from ``t0``, each taking 0.5 s."""
    return [
        {"event": "step", "ts": t0 + i, "step": s, "step_s": 0.5}
        for i, s in enumerate(range(first, last + 1))
    ]


LOG = _lines(
    {"event": "started", "ts": 0.0, "step": None, "restart_count": 0},
    *_steps(1, 6, 1.0),  # updates 1..6 at t=1..6
    {"event": "started", "ts": 10.0, "step": None, "restart_count": 1},
    {"event": "restored", "ts": 10.5, "step": 4, "restore_s": 0.2},
    *_steps(5, 8, 11.0),  # 5..8 at t=11..14
    {"event": "started", "ts": 20.0, "step": None, "restart_count": 2},
    {"event": "fallback", "ts": 20.4, "step": 8, "reason": "digest mismatch", "moved_to": "x"},
    {"event": "restored", "ts": 20.5, "step": 2, "restore_s": 0.3},
    *_steps(3, 10, 21.0),
    {"event": "completed", "ts": 28.5, "step": 10},
)


def test_each_started_opens_a_process() -> None:
    procs = split_processes(parse_events(LOG))
    assert [p.restored_step for p in procs] == [None, 4, 2]
    assert [p.outcome for p in procs] == ["killed", "killed", "completed"]
    assert [len(p.steps) for p in procs] == [6, 4, 8]
    assert procs[2].fallbacks[0].step == 8
    assert procs[1].first_step_start == pytest.approx(10.5)  # 11.0 - step_s


def test_an_update_is_kept_only_up_to_the_lowest_later_restore() -> None:
    procs = split_processes(parse_events(LOG))
    # The first process is redone from step 2 (the last restore), not 4.
    assert [kept_through(procs, i) for i in range(3)] == [2, 2, None]


def test_wasted_and_productive_time_follow_the_lowest_restore() -> None:
    procs = split_processes(parse_events(LOG))
    cut = spans(procs, 0.0, 30.0)

    def total(label: str) -> float:
        return sum(b - a for a, b, lab in cut if lab == label)

    # Process 0 keeps updates 1-2 (0.5 s for the first, then 1 s), wastes 3..6 (4 s);
    # process 1 wastes 5..8 (0.5 s + 3 s); process 2 keeps 3..10 (0.5 s + 7 s).
    assert total(WASTED_PROGRESS) == pytest.approx(4.0 + 3.5)
    assert total(PRODUCTIVE) == pytest.approx(1.5 + 7.5)
    assert sum(b - a for a, b, _ in cut) == pytest.approx(30.0)
