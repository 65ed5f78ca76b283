"""A slow node's cost as the report measures it, on literal step times: the healthy step,
the time lost while the node was in, the swap, after it; and the straggler's goodput bucket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recovery.ports.journal import incident_info
from recovery.report.goodput import PRODUCTIVE, STRAGGLER, SlowWindow, goodput_ranks, spans
from recovery.report.processes import Process, split_processes
from recovery.report.run import (
    Fault,
    Incident,
    Job,
    PhaseMark,
    RunRecord,
    SupervisorEntry,
    parse_events,
)
from recovery.report.slowdown import slowdown, slowdowns

HEALTHY, SLOW = 0.3, 0.9
T0 = 100.0
SLOW_FROM = 30  # updates 31.. take SLOW
LAST_SLOW = 40


def _ts(step: int) -> float:
    """When update ``step`` of the first run ended."""
    return T0 + HEALTHY * min(step, SLOW_FROM) + SLOW * max(0, step - SLOW_FROM)


BEGAN = _ts(SLOW_FROM) + 0.01
RESTART_AT = _ts(LAST_SLOW) + 3.0
FIRST_AFTER = RESTART_AT + 2.0  # update 41 of the relaunch ends here (it compiled)


def _processes(*, swapped: bool) -> list[Process]:
    last = LAST_SLOW if swapped else 60
    events: list[dict[str, Any]] = [{"event": "started", "ts": T0 - 5, "step": None}]
    events += [
        {"event": "step", "ts": _ts(s), "step": s, "step_s": 0.1} for s in range(1, last + 1)
    ]
    if swapped:
        events += [
            {"event": "started", "ts": RESTART_AT, "step": None},
            {"event": "restored", "ts": RESTART_AT + 0.5, "step": LAST_SLOW, "restore_s": 0.2},
        ]
        events += [
            {"event": "step", "ts": FIRST_AFTER + HEALTHY * (s - 41), "step": s, "step_s": 0.1}
            for s in range(41, 61)
        ]
    events.append({"event": "completed", "ts": events[-1]["ts"] + 0.1, "step": 60})
    return split_processes(parse_events([json.dumps(e) + "\n" for e in events]))


def _run(processes: list[Process], supervisor: tuple[SupervisorEntry, ...] = ()) -> RunRecord:
    inc = Incident(
        id="inc-slow",
        node="node2",
        fault="node-slow",
        verdict="observe",
        status="closed",
        opened=BEGAN + 10,
        closed=None,
        jobs=("1",),
        info=incident_info({}),
        phases=(PhaseMark("fault", BEGAN + 9.9, ""), PhaseMark("decided", BEGAN + 10, "")),
        actions=(),
    )
    return RunRecord(
        directory=Path("/nowhere"),
        scenario="slow-node",
        started=T0 - 6,
        finished=processes[-1].end + 1,
        nodes=("node1", "node2"),
        spares=(),
        job=Job("1", ("node1", "node2"), 60, 30, "mlp-medium", "/nowhere/job", 2),
        faults=(Fault("cpu-throttle", "node2", "cgroup-cpu-quota", BEGAN),),
        control_digest=None,
        final_digest=None,
        notes=(),
        incidents=(inc,),
        events=(),
        supervisor=supervisor,
    )


def test_a_swapped_slow_node_costs_its_slow_updates_and_the_swap() -> None:
    procs = _processes(swapped=True)
    said = SupervisorEntry("slow", BEGAN + 9, {"node": "node2", "swap": True, "why": "saves"})
    run = _run(procs, (said,))
    s = slowdown(run.incidents[0], run, procs)
    assert s.swap == "swapped"
    assert s.swap_detail == "saves"
    assert s.began == BEGAN
    assert s.baseline_step_s == pytest.approx(HEALTHY)
    assert s.slow_step_s == pytest.approx(SLOW)
    assert s.factor == pytest.approx(SLOW / HEALTHY)
    assert s.steps_slow == LAST_SLOW - SLOW_FROM
    assert s.lost_before_s == pytest.approx((SLOW - HEALTHY) * (LAST_SLOW - SLOW_FROM))
    # Last slow update -> first update past it, less the healthy step it would have taken.
    assert s.swap_s == pytest.approx(FIRST_AFTER - _ts(LAST_SLOW) - HEALTHY)
    assert s.lost_after_s == pytest.approx(0.0, abs=1e-9)
    assert s.total_s == pytest.approx(sum(filter(None, (s.lost_before_s, s.swap_s))))


def test_a_swap_after_a_first_judgement_that_did_not_pay_is_what_was_done() -> None:
    procs = _processes(swapped=True)
    said = (
        SupervisorEntry("slow", BEGAN + 5, {"node": "node2", "swap": False, "why": "too little"}),
        SupervisorEntry("slow", BEGAN + 9, {"node": "node2", "swap": True, "why": "saves"}),
    )
    run = _run(procs, said)
    s = slowdown(run.incidents[0], run, procs)
    assert (s.swap, s.swap_detail) == ("swapped", "saves")


def test_a_slow_node_left_in_costs_every_slow_update_to_the_end() -> None:
    procs = _processes(swapped=False)
    run = _run(procs)
    (s,) = slowdowns(run, procs)
    assert s.swap == "left in"
    assert s.swap_s is None
    assert s.lost_after_s is None
    assert s.steps_slow == 60 - SLOW_FROM
    assert s.lost_before_s == pytest.approx((SLOW - HEALTHY) * (60 - SLOW_FROM))


def test_too_few_healthy_updates_says_why_instead_of_guessing() -> None:
    procs = _processes(swapped=False)
    run = _run(procs)
    early = Fault("cpu-throttle", "node2", "cgroup-cpu-quota", _ts(3) + 0.01)
    s = slowdown(run.incidents[0], RunRecord(**{**run.__dict__, "faults": (early,)}), procs)
    assert s.lost_before_s is None
    assert "fewer than 3 healthy updates" in s.why


def test_the_excess_of_slow_updates_is_its_own_goodput_bucket() -> None:
    procs = _processes(swapped=False)
    started, finished = T0 - 6, procs[-1].end + 1
    window = SlowWindow(BEGAN, finished, HEALTHY)
    plain = goodput_ranks([procs], started, finished)
    slowed = goodput_ranks([procs], started, finished, slow=[window])
    excess = (SLOW - HEALTHY) * (60 - SLOW_FROM)
    assert slowed.bucket(STRAGGLER).seconds == pytest.approx(excess)
    assert slowed.productive_s == pytest.approx(plain.productive_s - excess)
    labels = [label for _, _, label in spans(procs, started, finished, slow=[window])]
    assert STRAGGLER in labels
    assert PRODUCTIVE in labels
    assert slowed.productive_s + sum(b.seconds for b in slowed.badput) == pytest.approx(
        slowed.wall_s
    )
