"""The supervisor's own watch on its launch (recovery/inalloc/hang.py, the hang path of
recovery/inalloc/supervisor.py): a launch whose processes stop making progress is ended after
its stacks are taken and relaunched inside the allocation. The processes are real progress
writers on a fake clock; Slurm is the supervisor's port, faked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recover.jobstep import final_step
from recovery.inalloc.decide import (
    Finish,
    Relaunch,
    Requeue,
    after_hang,
    after_slow,
    first_layout,
    swap_gain,
)
from recovery.inalloc.hang import LaunchWatch
from recovery.inalloc.supervisor import Supervisor, SupervisorJournal
from recovery.progress import Budgets, Phase, ProgressWriter, read_record, write_job_budgets
from recovery.progress.stacks import stacks_path, supervised, write_slow_report

#: Learned after one step: the tests need not train long to be judged.
BUDGETS = Budgets(floor_s=5.0, factor=10.0, learn_after=1)
STEP_S = 0.25


@dataclass
class Wall:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class _TimeUp(Exception):
    """The test's own limit on a launch nobody ends."""


@dataclass
class TrainingStep:
    """A launch whose processes are real progress writers: each wait is a quarter second of
    training; after ``hang_at`` finished steps the process of rank ``hang_rank`` stops (its
    peers enter the next step and wait in it); ``end()`` kills them all (status 137);
    otherwise all finish ``steps`` steps and the launch ends 0."""

    directory: Path
    nodes: list[str]
    wall: Wall
    steps: int = 40
    hang_at: int | None = None
    hang_rank: int = 1
    phase_at: tuple[int, Phase, float] | None = None
    """(step, phase, seconds): rank 0 spends that long in the phase after that step."""
    stacks: bool = True
    """The node agents write each process's stacks once it stalls."""
    max_waits: int = 5_000
    slow_rank: int | None = None
    """From step 10, this process takes 0.4 s of its own work a step, its peers 0.1 s."""
    slow_ramp_at: int | None = None
    """With a slow rank: 0.2 s of work a step until this step, then 0.4 s (a node that slows
    down by degrees)."""
    pid: int = 1
    warm: list[str] = field(default_factory=list)
    ended: bool = False
    step: int = 0
    _writers: list[ProgressWriter] = field(default_factory=list)
    _phase_left: float = 0.0
    _before: tuple[Phase, float, float] = (Phase.steps, 0.0, 0.0)

    def __post_init__(self) -> None:
        self._writers = [
            ProgressWriter(self.directory, rank=r, size=len(self.nodes), node=n, clock=self.wall)
            for r, n in enumerate(self.nodes)
        ]

    def wait(self, timeout: float | None = None) -> int | None:
        if self.ended:
            return 137
        self.max_waits -= 1
        if self.max_waits < 0:
            raise _TimeUp
        self.wall.now += STEP_S
        hung = self.hang_at is not None and self.step >= self.hang_at
        for w in self._writers:
            w.alive()  # their liveness threads run on: a stuck main thread, not a frozen process
        if self._phase_left > 0:
            self._phase_left -= STEP_S
            if self._phase_left <= 0:
                self._writers[0].restore(self._before)
            return None
        for r, w in enumerate(self._writers):
            if hung and r == self.hang_rank:
                continue
            if hung:
                w.step_started(self.step + 1)  # waits in the collective with the lost peer
                continue
            w.step_started(self.step + 1)
            slow = r == self.slow_rank and self.step >= 10
            ramping = self.slow_ramp_at is not None and self.step < self.slow_ramp_at
            w.step_finished(self.step + 1, compute_s=(0.2 if ramping else 0.4) if slow else 0.1)
        if hung:
            if self.stacks:
                for r in range(len(self._writers)):
                    stacks_path(self.directory, r).parent.mkdir(exist_ok=True)
                    stacks_path(self.directory, r).write_text(f"rank {r}, at {self.wall.now}\n")
            return None
        self.step += 1
        if self.phase_at is not None and self.step == self.phase_at[0]:
            self._before = self._writers[0].enter(self.phase_at[1])
            self._phase_left = self.phase_at[2]
        if self.step >= self.steps:
            for w in self._writers:
                w.close()
            return 0
        return None

    def signal(self, signum: int) -> None:
        raise AssertionError("no signal is expected")

    def end(self) -> None:
        self.ended = True


@dataclass
class HangJob:
    """The supervisor's Slurm: launch i hangs at ``hangs[i]`` finished steps (None: trains
    to the end); rank ``hang_ranks[i]`` (default 1) is the one that stops."""

    directory: Path
    wall: Wall
    nodes: list[str]
    hangs: list[int | None]
    hang_ranks: list[int] = field(default_factory=list)
    launches: list[list[str]] = field(default_factory=list)
    released: list[list[str]] = field(default_factory=list)
    steps: list[TrainingStep] = field(default_factory=list)
    step_kw: dict[str, object] = field(default_factory=dict)
    launch_kw: list[dict[str, object]] = field(default_factory=list)
    """Launch i's own settings over ``step_kw``."""

    def job_nodes(self) -> list[str]:
        return list(self.nodes)

    def bad_nodes(self, nodes: Sequence[str]) -> list[str]:
        return []

    def release(self, keep: Sequence[str]) -> None:
        self.released.append(list(keep))
        self.nodes = [n for n in self.nodes if n in keep]

    def launch(self, nodes: Sequence[str], command: Sequence[str]) -> TrainingStep:
        i = len(self.launches)
        self.launches.append(list(nodes))
        self.wall.now += 1.0  # the processes start after the launch
        rank = self.hang_ranks[i] if i < len(self.hang_ranks) else 1
        kw = {**self.step_kw, **(self.launch_kw[i] if i < len(self.launch_kw) else {})}
        step = TrainingStep(
            self.directory, list(nodes), self.wall, hang_at=self.hangs[i], hang_rank=rank,
            **kw,  # type: ignore[arg-type]
        )  # fmt: skip
        self.steps.append(step)
        return step

    def warm(self, nodes: Sequence[str], command: Sequence[str]) -> list[str]:
        return []

    def close(self) -> None:
        pass

    def time_left(self) -> float | None:
        return None

    def hold(self, node: str, reason: str) -> None:
        raise AssertionError("no spare is checked here")


def _supervise(job: HangJob, tmp_path: Path, **kw: object) -> tuple[object, SupervisorJournal]:
    clock = iter(range(100_000))
    journal = SupervisorJournal(tmp_path / "sup.jsonl", clock=job.wall)
    sup = Supervisor(
        slurm=job,
        command=["recover", "train"],
        processes=2,
        batch_host="n1",
        journal=journal,
        progress=job.directory,
        budgets=BUDGETS,
        clock=lambda: float(next(clock)),
        wall=job.wall,
        sleep=lambda _s: None,
        standby_after_s=None,
        **kw,  # type: ignore[arg-type]
    )
    return sup.run(), journal


def _events(journal: SupervisorJournal, name: str) -> list[dict[str, object]]:
    return [e for e in journal.events if e["event"] == name]


def _job(tmp_path: Path, hangs: list[int | None], **kw: object) -> HangJob:
    return HangJob(tmp_path / "progress", Wall(), ["n1", "n2", "n3", "n4"], hangs, **kw)  # type: ignore[arg-type]


def test_a_hung_launch_is_ended_after_its_stacks_and_relaunched_on_the_same_nodes(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path, [10, None])
    decision, journal = _supervise(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n3"]]
    assert job.steps[0].ended
    assert not job.steps[1].ended
    assert job.released == []  # a first hang is the process's: no node is given back
    (stalled,) = _events(journal, "stalled")
    assert stalled["confident"] is True
    assert stalled["culprits"] == [
        {"rank": 1, "node": "n3", "why": stalled["culprits"][0]["why"]}  # type: ignore[index]
    ]
    assert "did not enter step 11" in str(stalled["culprits"])
    # Judged no sooner than the floor after the last step, and not long after it either.
    assert 5.0 <= float(stalled["idle_s"]) <= 6.0  # type: ignore[arg-type]
    assert _events(journal, "stacks")[0]["missing"] == []
    (relaunch,) = _events(journal, "relaunch")
    assert relaunch["why"] == "hung: relaunched on the same nodes"
    order = [e["event"] for e in journal.events]
    assert order.index("stacks") < order.index("step-ended") < order.index("relaunch")


def test_the_supervisor_marks_the_folder_it_watches_while_it_runs(tmp_path: Path) -> None:
    """The agents leave moving the job off a slow node to the supervisor while the mark is
    there; it goes with the supervisor."""
    job = _job(tmp_path, [None])
    seen: list[bool] = []
    launch = job.launch

    def launch_and_look(nodes: Sequence[str], command: Sequence[str]) -> TrainingStep:
        seen.append(supervised(job.directory))
        return launch(nodes, command)

    job.launch = launch_and_look  # type: ignore[method-assign]
    _supervise(job, tmp_path)
    assert seen == [True]
    assert not supervised(job.directory)


def test_stacks_that_do_not_come_are_waited_for_a_bounded_time_and_named(tmp_path: Path) -> None:
    job = _job(tmp_path, [10, None], step_kw={"stacks": False})
    decision, journal = _supervise(job, tmp_path, stacks_wait_s=3.0)
    assert decision == Finish(0, "the training step completed")
    assert _events(journal, "stacks")[0]["missing"] == [0, 1]


def test_a_node_named_for_two_hangs_in_a_row_is_swapped_for_a_spare(tmp_path: Path) -> None:
    job = _job(tmp_path, [10, 4, None])
    decision, journal = _supervise(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    # n3 hung twice: the third launch takes the spare n4 in its place, and n3 goes back.
    assert job.launches == [["n2", "n3"], ["n2", "n3"], ["n2", "n4"]]
    assert job.released == [["n1", "n2", "n4"]]
    assert [e["why"] for e in _events(journal, "relaunch")] == [
        "hung: relaunched on the same nodes",
        "hung again on n3: relaunched without it, on a spare",
    ]


def test_hangs_of_different_ranks_keep_the_nodes(tmp_path: Path) -> None:
    job = _job(tmp_path, [10, 4, None], hang_ranks=[1, 0])
    decision, _ = _supervise(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"]] * 3
    assert job.released == []


def test_a_hang_with_the_relaunches_spent_requeues(tmp_path: Path) -> None:
    job = _job(tmp_path, [10, 4])
    decision, journal = _supervise(job, tmp_path, max_relaunches=1)
    assert isinstance(decision, Requeue)
    assert "restart budget is spent (1 relaunches)" in decision.why
    assert _events(journal, "requeue")


@pytest.mark.parametrize("phase", [Phase.save, Phase.evaluation, Phase.paused])
def test_a_long_announced_phase_is_not_a_hang(tmp_path: Path, phase: Phase) -> None:
    # Rank 0 spends 30 s in the phase (six times the step budget) while rank 1 waits.
    job = _job(tmp_path, [None], step_kw={"phase_at": (12, phase, 30.0)})
    decision, journal = _supervise(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert not _events(journal, "stalled")
    assert len(job.launches) == 1


def test_without_a_progress_folder_a_hung_launch_is_left_alone(tmp_path: Path) -> None:
    job = _job(tmp_path, [10], step_kw={"max_waits": 2_000})
    journal = SupervisorJournal(tmp_path / "sup.jsonl", clock=job.wall)
    ticks = iter(range(100_000))
    sup = Supervisor(
        slurm=job, command=["recover", "train"], processes=2, batch_host="n1", journal=journal,
        clock=lambda: float(next(ticks)), wall=job.wall, sleep=lambda _s: None,
        standby_after_s=None,
    )  # fmt: skip
    with pytest.raises(_TimeUp):
        sup.run()
    assert job.wall.now - 1_000_000.0 > 400  # hung for minutes of its clock
    assert not _events(journal, "stalled")
    assert not job.steps[0].ended


def test_records_of_an_ended_launch_do_not_count(tmp_path: Path) -> None:
    wall = Wall()
    directory = tmp_path / "progress"
    old = ProgressWriter(directory, rank=1, size=2, node="n3", clock=wall)
    old.step_finished(7)
    wall.now += 30.0
    watch = LaunchWatch(directory, 2, launched_at=wall.now, budgets=BUDGETS)
    assert watch.records() == {}
    assert watch.look(wall.now + 100).state == "unwatched"
    new = ProgressWriter(directory, rank=0, size=2, node="n2", clock=wall)
    assert list(watch.records()) == [0]
    assert watch.look(wall.now + 100).state == "running"  # its first step has the start-up budget
    new.close()
    old.close()


def test_after_hang_rules() -> None:
    layout = first_layout(["n1", "n2", "n3", "n4"], "n1", 2)  # step n2 n3, spares n4 n1
    same = after_hang(layout, ["n3"], hung_before=[], relaunches=0, max_relaunches=3)
    assert same == Relaunch(
        ("n2", "n3"), (), (), ("n4", "n1"), "hung: relaunched on the same nodes"
    )
    swap = after_hang(layout, ["n3"], hung_before=["n3"], relaunches=1, max_relaunches=3)
    assert isinstance(swap, Relaunch)
    assert (swap.nodes, swap.release) == (("n2", "n4"), ("n3",))
    unnamed = after_hang(layout, [], hung_before=["n3"], relaunches=1, max_relaunches=3)
    assert unnamed.nodes == ("n2", "n3")  # type: ignore[union-attr]
    spent = after_hang(layout, ["n3"], hung_before=[], relaunches=3, max_relaunches=3)
    assert isinstance(spent, Requeue)
    # The batch host is never given back: its hang, repeated, relaunches in place.
    last = first_layout(["n1", "n2"], "n1", 2)  # step n2 n1, no spare
    kept = after_hang(last, ["n1"], hung_before=["n1"], relaunches=1, max_relaunches=3)
    assert isinstance(kept, Relaunch)
    assert (kept.nodes, kept.release) == (("n2", "n1"), ())
    nospare = after_hang(
        first_layout(["n1", "n2", "n3"], "n1", 3), ["n2"], hung_before=["n2"], relaunches=1,
        max_relaunches=3,
    )  # fmt: skip
    assert isinstance(nospare, Relaunch)
    assert nospare.release == ()
    assert "no spare is left" in nospare.why


def test_the_jobs_own_budgets_are_taken(tmp_path: Path) -> None:
    """A job that allows 60 s without a step (``budgets.json``, written by process 0 through
    ``open_progress(budgets=...)``) is judged after 60 s, not the default 5 s."""
    job = _job(tmp_path, [10, None])
    write_job_budgets(job.directory, {"floor_s": 60.0})
    decision, journal = _supervise(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    (stalled,) = _events(journal, "stalled")
    assert 60.0 <= float(stalled["idle_s"]) <= 61.0  # type: ignore[arg-type]
    assert stalled["budget_s"] == 60.0
    assert not _events(journal, "budgets-refused")


def test_budgets_that_cannot_be_taken_are_journaled_and_the_defaults_judge(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path, [10, None])
    job.directory.mkdir(parents=True)
    (job.directory / "budgets.json").write_text('{"flor_s": 60}')
    decision, journal = _supervise(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    refused, again = _events(journal, "budgets-refused")  # once for each launch
    assert again["attempt"] == 1
    assert "Unknown" in str(refused["error"])
    assert "flor_s" in str(refused["error"])
    assert float(_events(journal, "stalled")[0]["idle_s"]) < 6.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("swap", "steps", "swapped", "why"),
    [
        (True, 200, True, "n3 is slow: relaunched on the spare n4, saving about"),
        (False, 200, False, "the job asks for reports only (straggler.swap false)"),
        (True, 40, False, "not more than a relaunch costs (10.0 s)"),
    ],
)
def test_a_slow_node_is_swapped_for_a_spare_only_when_asked_and_worth_it(
    tmp_path: Path, swap: bool, steps: int, swapped: bool, why: str
) -> None:
    job = _job(
        tmp_path, [None, None], step_kw={"steps": steps},
        launch_kw=[{"slow_rank": 1}, {}],
    )  # fmt: skip
    write_job_budgets(job.directory, {"straggler": {"swap": swap}})
    decision, journal = _supervise(job, tmp_path, steps=steps)
    assert decision == Finish(0, "the training step completed")
    (slow,) = _events(journal, "slow")
    assert (slow["node"], slow["rank"], slow["swap"]) == ("n3", 1, swapped)
    assert slow["step_s"] == pytest.approx(0.4)
    assert slow["peers_s"] == pytest.approx(0.1)
    assert why in str(slow["why"])
    if swapped:
        # No agent here: the report the supervisor gives it a moment for never came.
        assert [e["node"] for e in _events(journal, "slow-unreported")] == ["n3"]
        assert job.launches == [["n2", "n3"], ["n2", "n4"]]
        assert job.released == [["n1", "n2", "n4"]]
        # What the relaunch cost is measured for the next decision: decision to first step.
        assert float(_events(journal, "relaunch-cost")[0]["cost_s"]) > 0  # type: ignore[arg-type]
    else:
        assert job.launches == [["n2", "n3"]]
        assert job.released == []
    assert not _events(journal, "stalled")


def test_a_straggler_whose_swap_did_not_pay_yet_is_judged_again(tmp_path: Path) -> None:
    """Found while its slowdown was small (or its window still half healthy), the swap does
    not pay; the slowdown grows, and a later judgement swaps it. Journaled twice: the first
    judgement and the swap."""
    job = _job(
        tmp_path, [None, None], step_kw={"steps": 100},
        launch_kw=[{"slow_rank": 1, "slow_ramp_at": 40}, {}],
    )  # fmt: skip
    write_job_budgets(job.directory, {"straggler": {"swap": True}})
    decision, journal = _supervise(job, tmp_path, steps=100)
    assert decision == Finish(0, "the training step completed")
    first, then = _events(journal, "slow")
    assert first["swap"] is False
    assert "not more than a relaunch costs" in str(first["why"])
    assert then["swap"] is True
    assert float(then["step"]) > float(first["step"])  # type: ignore[arg-type]
    assert job.launches == [["n2", "n3"], ["n2", "n4"]]


def test_after_slow_rules() -> None:
    layout = first_layout(["n1", "n2", "n3", "n4"], "n1", 2)  # step n2 n3, spares n4 n1
    kw = {"gain_s": 50.0, "cost_s": 10.0, "relaunches": 0, "max_relaunches": 3}
    swap = after_slow(layout, "n3", **kw)  # type: ignore[arg-type]
    assert isinstance(swap, Relaunch)
    assert (swap.nodes, swap.release, swap.spares_left) == (("n2", "n4"), ("n3",), ("n1",))
    assert after_slow(layout, "n9", **kw) == "n9 is not in the step"  # type: ignore[arg-type]
    spent = {**kw, "relaunches": 3}
    assert "budget is spent" in str(after_slow(layout, "n3", **spent))  # type: ignore[arg-type]
    last = first_layout(["n1", "n2"], "n1", 2)  # step n2 n1: the batch host trains
    assert "runs the batch script" in str(after_slow(last, "n1", **kw))  # type: ignore[arg-type]
    assert "no spare" in str(after_slow(last, "n2", **kw))  # type: ignore[arg-type]
    assert swap_gain(0.4, 0.1, 100) == pytest.approx(30.0)
    assert swap_gain(0.1, 0.4, 100) == 0.0


def test_the_final_step_is_read_from_the_command() -> None:
    assert final_step(["recover", "train", "--steps", "300"]) == 300
    assert final_step(["recover", "train", "--steps=40"]) == 40
    assert final_step(["recover", "train"]) is None
    assert final_step(["recover", "train", "--steps", "many"]) is None


def test_a_swap_waits_for_the_agents_report_of_the_slow_node(tmp_path: Path) -> None:
    job = _job(tmp_path, [None, None], step_kw={"steps": 200}, launch_kw=[{"slow_rank": 1}, {}])
    write_job_budgets(job.directory, {"straggler": {"swap": True}})
    # The node's agent reported it (agents/progress.py keeps the report beside the records).
    agent = ProgressWriter(tmp_path / "elsewhere", rank=1, size=2, node="n3", clock=job.wall)
    job.wall.now += 1.5  # after the launch began
    write_slow_report(job.directory, read_record(agent.path), "rank 1 on n3 ...", job.wall.now)
    decision, journal = _supervise(job, tmp_path, steps=200)
    assert decision == Finish(0, "the training step completed")
    assert [e["swap"] for e in _events(journal, "slow")] == [True]
    assert not _events(journal, "slow-unreported")
    agent.close()
