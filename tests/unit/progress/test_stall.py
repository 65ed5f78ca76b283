"""The stall rule and attribution, on records as the writer makes them (a fake clock)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.progress import Budgets, Phase, ProgressWriter, Record, StallWatch, read_records


class Job:
    """K writers on one fake clock; ``tick`` moves time and refreshes the live ones' marks."""

    def __init__(self, directory: Path, size: int = 2) -> None:
        self.t = 0.0
        self.dir = directory
        self.w = [
            ProgressWriter(directory, rank=r, size=size, node=f"node{r + 1}", clock=self.clock)
            for r in range(size)
        ]
        self.frozen: set[int] = set()

    def clock(self) -> float:
        return self.t

    def tick(self, dt: float) -> None:
        self.t += dt
        for r, w in enumerate(self.w):
            if r not in self.frozen:
                with w._lock:  # what the liveness thread does each second
                    w._fields.alive_at = self.t
                    w._write()

    def step(self, n: int, ranks: list[int] | None = None, dt: float = 0.5) -> None:
        for r in ranks if ranks is not None else range(len(self.w)):
            self.w[r].step_started(n)
        self.tick(0.01)
        for r in ranks if ranks is not None else range(len(self.w)):
            self.w[r].step_finished(n)
        self.tick(dt - 0.01)

    def records(self) -> dict[int, Record]:
        return read_records(self.dir)


def trained(tmp_path: Path, steps: int = 20, size: int = 2) -> tuple[Job, StallWatch]:
    job, watch = Job(tmp_path, size), StallWatch()
    for n in range(1, steps + 1):
        job.step(n)
        assert watch.observe(job.records(), job.t).state == "running"
    return job, watch


def test_nothing_reported_is_unwatched_never_stalled(tmp_path: Path) -> None:
    v = StallWatch().observe({}, 1e9)
    assert v.state == "unwatched"
    assert not v.stalled


def test_budget_is_learned_from_the_jobs_own_steps(tmp_path: Path) -> None:
    _job, watch = trained(tmp_path)
    assert watch.step_budget_s() == pytest.approx(5.0)  # floor: 10 x 0.5 s is 5 s too
    slow, slow_watch = Job(tmp_path / "slow"), StallWatch()
    for n in range(1, 8):
        slow.step(n, dt=2.0)
        slow_watch.observe(slow.records(), slow.t)
    assert slow_watch.step_budget_s() == pytest.approx(20.0)  # 10 x 2 s


def test_a_short_phase_every_step_does_not_stop_the_learning(tmp_path: Path) -> None:
    """A copy into node-local memory after every step (the memory tier), announced as a
    save: the time per step is still learned, the copies left out of it."""
    job, watch = Job(tmp_path), StallWatch()
    for n in range(1, 21):
        job.step(n, dt=0.4)
        for w in job.w:
            before = w.enter("save")
        job.tick(0.1)
        for w in job.w:
            w.restore(before)
        watch.observe(job.records(), job.t)
    assert watch.step_budget_s() == pytest.approx(5.0)  # learned: not the unlearned 60 s
    assert job.records()[0].last_step_s == pytest.approx(0.4)


def test_a_stall_that_ended_by_itself_is_not_learnt(tmp_path: Path) -> None:
    """An unannounced 15 s wait (a stall the job came out of) is no step time: after it a
    second stall is judged by the same 5 s, not 10 x 15 s."""
    job, watch = trained(tmp_path)
    job.tick(15.0)
    assert watch.observe(job.records(), job.t).stalled
    for n in range(21, 41):
        job.step(n)
        watch.observe(job.records(), job.t)
    assert watch.step_budget_s() == pytest.approx(5.0)
    job.tick(6.0)
    assert watch.observe(job.records(), job.t).stalled


def test_unlearned_budget_before_enough_steps(tmp_path: Path) -> None:
    job, watch = Job(tmp_path), StallWatch()
    job.step(1)
    watch.observe(job.records(), job.t)
    job.tick(30)
    assert watch.observe(job.records(), job.t).state == "running"  # 60 s until learned
    job.tick(31)
    assert watch.observe(job.records(), job.t).stalled


def test_main_thread_stuck_before_the_step_is_named(tmp_path: Path) -> None:
    """Rank 1's main thread blocks (a syscall, a data loader) after step 20; rank 0 enters
    step 21 and waits in its collective. Both stay alive."""
    job, watch = trained(tmp_path)
    job.w[0].step_started(21)
    job.tick(4.0)
    assert watch.observe(job.records(), job.t).state == "running"
    job.tick(1.5)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert v.confident
    assert [(c.rank, c.node) for c in v.culprits] == [(1, "node2")]
    assert "did not enter step 21" in v.culprits[0].why
    assert v.step == 20
    assert v.idle_s == pytest.approx(5.99, abs=0.02)


def test_frozen_process_is_named_even_mid_step(tmp_path: Path) -> None:
    """Rank 0 is stopped whole (SIGSTOP) inside step 21, as rank 1 is: progress alone cannot
    tell them apart, the liveness mark can."""
    job, watch = trained(tmp_path)
    for w in job.w:
        w.step_started(21)
    job.frozen.add(0)
    job.tick(6.0)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert v.confident
    assert [c.rank for c in v.culprits] == [0]
    assert v.culprits[0].why.startswith("frozen")


def test_same_point_everywhere_is_not_attributed(tmp_path: Path) -> None:
    job, watch = trained(tmp_path)
    for w in job.w:
        w.step_started(21)
    job.tick(6.0)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert not v.confident
    assert v.culprits == ()
    assert "cannot tell" in v.why


def test_every_process_silent_is_not_attributed(tmp_path: Path) -> None:
    job, watch = trained(tmp_path)
    job.frozen.update({0, 1})
    job.tick(8.0)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert not v.confident
    assert "every process has been silent" in v.why


@pytest.mark.parametrize(
    ("phase", "long_s"),
    [("save", 20 * 0.5 * 10), ("evaluation", 600.0), ("startup", 300.0), ("paused", 10_000.0)],
)
def test_announced_phases_get_their_own_budget(tmp_path: Path, phase: str, long_s: float) -> None:
    """A save 20x slower than the steps' budget, a long evaluation, a slow compile, a pause:
    rank 0 is in the phase, rank 1 waits for it in the loop; no verdict of stalled."""
    job, watch = trained(tmp_path)
    before = job.w[0].enter(phase)
    for _ in range(int(long_s // 5)):
        job.tick(5.0)
        assert watch.observe(job.records(), job.t).state == "running"
    job.w[0].restore(before)
    job.step(21)
    assert watch.observe(job.records(), job.t).state == "running"
    assert watch.step_budget_s() == pytest.approx(5.0)  # the phase did not teach it anything


def test_a_slow_first_step_has_the_start_up_budget(tmp_path: Path) -> None:
    """A loop that compiles in its first step (no warm-up of its own): ten minutes in step 1
    is no hang; the start-up budget (900 s) still ends it."""
    job, watch = Job(tmp_path), StallWatch()
    for w in job.w:
        w.step_started(1)
    for _ in range(120):
        job.tick(5.0)
        assert watch.observe(job.records(), job.t).state == "running"
    job.tick(301)
    assert watch.observe(job.records(), job.t).stalled


def test_phase_over_its_budget_names_the_process_in_it(tmp_path: Path) -> None:
    job, watch = trained(tmp_path)
    job.w[1].enter("save", budget_s=30)
    job.tick(31)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert v.confident
    assert [c.rank for c in v.culprits] == [1]
    assert "save phase" in v.culprits[0].why


def test_done_processes_end_the_watch(tmp_path: Path) -> None:
    job, watch = trained(tmp_path)
    for w in job.w:
        w.close()
    job.tick(100)
    assert watch.observe(job.records(), job.t).state == "done"


def test_one_process_left_running_is_still_judged(tmp_path: Path) -> None:
    """Rank 0 finished and closed; rank 1 never did: it alone decides."""
    job, watch = trained(tmp_path)
    job.w[0].close()
    job.tick(6)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert [c.rank for c in v.culprits] == [1]


def test_single_process_job_is_named(tmp_path: Path) -> None:
    job, watch = trained(tmp_path, size=1)
    job.tick(6)
    v = watch.observe(job.records(), job.t)
    assert v.stalled
    assert v.confident
    assert v.culprits[0].rank == 0


def test_budgets_are_checked() -> None:
    with pytest.raises(UsageError, match="floor_s must be > 0"):
        Budgets(floor_s=0)
    with pytest.raises(UsageError, match="learn_after"):
        Budgets(learn_after=0)


def test_record_budget_overrides_the_default(tmp_path: Path) -> None:
    rec = replace(
        next(iter(trained(tmp_path)[0].records().values())), phase=Phase.save, phase_budget_s=7
    )
    assert Budgets().phase_s(rec) == 7
