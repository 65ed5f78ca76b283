"""``recover train``'s long phases on request (``--save-delay``, ``--eval-every`` and
``--eval-seconds``, ``--pause-at`` and ``--pause-seconds``, ``--first-step-delay``): each
presents in the progress record as the real thing does, in the process that has it, none
changes the training, and the options are checked.

The 2-process run's records, read while it runs, are also replayed through the watcher
(:class:`StallWatch`, budgets scaled to the run's seconds): by its rule the job is never
stalled; with the phases left unannounced, or the slow first step without its start-up
budget, it is stalled in each.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.progress import Budgets, Phase, Record, StallWatch, read_records
from recovery.progress.stall import PHASE_BUDGETS_S
from recovery.train.loop import TrainOptions, run_training
from recovery.train.options import LongPhases, validate
from tests.train.multi import final_digest, run

STEPS = 12  # tests.train.conftest.K2_STEPS
#: Seconds of each long phase in the 2-process run, and the step budget its replay uses: a
#: phase lasts twice the budget, which a step on a loaded machine never comes near.
LONG_S = 4.0
FLOOR_S = 2.0


def _opts(run_dir: Path, long: LongPhases, steps: int = 8) -> TrainOptions:
    return TrainOptions(
        run_dir=run_dir, steps=steps, save_every=3, seed=7, async_save=False, long_phases=long
    )


@pytest.mark.parametrize(
    ("long", "message"),
    [
        (LongPhases(save_delay=-1), r"--save-delay must be a number of seconds >= 0 \(got -1\)"),
        (LongPhases(first_step_delay=float("inf")), "--first-step-delay must be a number"),
        (LongPhases(eval_every=-2), r"--eval-every must be >= 0 \(got -2; 0 is off\)"),
        (LongPhases(eval_every=8), "--eval-every 8 never evaluates a run of --steps 8: "
         "evaluations come between steps; give at most 7"),
        (LongPhases(eval_seconds=3), r"--eval-seconds needs --eval-every"),
        (LongPhases(pause_at=8, pause_seconds=1), "--pause-at 8 is not between two steps of "
         "a run of --steps 8; give 1 to 7"),
        (LongPhases(pause_seconds=1), "--pause-at and --pause-seconds go together; give both"),
        (LongPhases(pause_at=2), "--pause-at and --pause-seconds go together"),
    ],
)  # fmt: skip
def test_bad_long_phases_name_the_option(tmp_path: Path, long: LongPhases, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        validate(_opts(tmp_path, long))


def test_long_phases_change_nothing_of_the_training(tmp_path: Path) -> None:
    """One process: the same digest with every long phase as without, and each phase was
    gone through (the evaluation's loss logged, the pause said)."""
    said: list[str] = []
    plain = run_training(_opts(tmp_path / "plain", LongPhases()), handle_signals=False)
    long = LongPhases(save_delay=0.1, eval_every=4, eval_seconds=0.1, pause_at=5,
                      pause_seconds=0.1, first_step_delay=0.1)  # fmt: skip
    t = time.monotonic()
    slow = run_training(_opts(tmp_path / "slow", long), handle_signals=False, log=said.append)
    assert (slow.step, slow.state_digest) == (plain.step, plain.state_digest)
    assert time.monotonic() - t >= 0.1 * 5  # two saves (3 and 6), one evaluation, a pause
    (evaluation,) = [m for m in said if m.startswith("recover: evaluation")]  # 8 is the last
    assert evaluation.startswith("recover: evaluation after step 4: held-out loss ")
    assert "recover: paused after step 5 for 0.1 s" in said


def test_a_preemption_signal_ends_a_pause(tmp_path: Path) -> None:
    """SIGTERM while paused: the pause ends at once, the step is saved, the run preempted."""
    records = tmp_path / "progress"

    def signal_when_paused() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(r.phase is Phase.paused for r in read_records(records).values()):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=signal_when_paused, daemon=True)
    killer.start()
    t = time.monotonic()
    out = run_training(_opts(tmp_path, LongPhases(pause_at=2, pause_seconds=120)))
    killer.join(5)
    assert (out.preempted, out.step) == (True, 2)
    assert time.monotonic() - t < 60


@dataclass(frozen=True)
class _Look:
    at: float
    records: dict[int, Record]


def _watch_records(directory: Path, stop: threading.Event, looks: list[_Look]) -> None:
    while not stop.wait(0.05):
        records = read_records(directory)
        if records:
            looks.append(_Look(time.time(), records))


@pytest.mark.slow
def test_each_long_phase_presents_where_a_real_loop_has_it(
    tmp_path: Path, cache: Path, k2_control: tuple[int, str]
) -> None:
    """Two processes: process 0 alone is in its save and evaluation phases while process 1
    waits in the step loop; both pause; both take long over their first step, unannounced.
    The digest is the uninterrupted run's. Replayed through the watcher, no look is stalled,
    and each phase is stalled once unannounced (the first step: without its budget)."""
    steps, control = k2_control
    assert steps == STEPS
    run_dir = tmp_path / "run"
    looks: list[_Look] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=_watch_records, args=(run_dir / "progress", stop, looks), daemon=True
    )
    watcher.start()
    try:
        run(run_dir, 2, STEPS, 6, "--compile-cache", str(cache), "--save-delay", str(LONG_S),
            "--eval-every", "8", "--eval-seconds", str(LONG_S), "--pause-at", "10",
            "--pause-seconds", str(LONG_S), "--first-step-delay", str(LONG_S))  # fmt: skip
    finally:
        stop.set()
        watcher.join(5)
    assert final_digest(run_dir, 2) == control

    def seen(lead: Phase, other: Phase, step: int) -> float:
        """Seconds the looks saw process 0 in ``lead`` and process 1 in ``other``, both
        after ``step``."""
        at = [
            x.at for x in looks
            if len(x.records) == 2
            and (x.records[0].phase, x.records[1].phase) == (lead, other)
            and x.records[0].step_finished == x.records[1].step_finished == step
        ]  # fmt: skip
        return max(at) - min(at) if at else 0.0

    assert seen(Phase.save, Phase.steps, 6) >= LONG_S - 1  # the save at 6 (12 is the final)
    assert seen(Phase.evaluation, Phase.steps, 8) >= LONG_S - 1
    assert seen(Phase.paused, Phase.paused, 10) >= LONG_S - 1
    assert seen(Phase.steps, Phase.steps, -1) >= LONG_S - 1  # in step 1, saying nothing

    budgets = Budgets(floor_s=FLOOR_S, unlearned_s=FLOOR_S, learn_after=3)
    assert _stalled(looks, budgets) == []
    for phase in (Phase.save, Phase.evaluation, Phase.paused):
        stalled = _stalled(looks, budgets, _unannounced(phase))
        assert any(r.phase is phase for x in stalled for r in x.records.values()), phase
    plain: dict[Phase, float] = {p: b for p, b in PHASE_BUDGETS_S.items() if p is not Phase.startup}
    stalled = _stalled(looks, replace(budgets, phases_s=plain))
    in_first = [x for x in stalled if all(_in_first_step(r) for r in x.records.values())]
    assert len(in_first) >= 2, [x.records for x in stalled]


def _in_first_step(rec: Record) -> bool:
    return rec.phase is Phase.steps and rec.step_finished == -1


def _unannounced(phase: Phase) -> Callable[[Record], Record]:
    """A record as it would read had the loop not announced ``phase`` (between steps): still
    in the step loop, after its last finished step."""

    def strip(rec: Record) -> Record:
        if rec.phase is not phase or not 0 < rec.step_finished < STEPS:
            return rec
        return replace(rec, phase=Phase.steps, phase_since=rec.step_finished_at, phase_budget_s=0)

    return strip


def _stalled(
    looks: list[_Look], budgets: Budgets, seen: Callable[[Record], Record] = lambda r: r
) -> list[_Look]:
    """The looks the watcher judges stalled, the records ``seen`` so."""
    watch = StallWatch(budgets)
    return [
        x
        for x in looks
        if watch.observe({r: seen(rec) for r, rec in x.records.items()}, x.at).stalled
    ]
