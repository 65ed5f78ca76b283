"""The job supervisor's decisions (recovery/inalloc), with a fake of its own JobSlurm port:
which nodes train, when it relaunches on a spare, when it gives up to a requeue."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recovery.errors import SlurmRefusedError
from recovery.inalloc.decide import (
    Finish,
    Relaunch,
    Requeue,
    after_step,
    decision_line,
    first_layout,
    launch_status,
)
from recovery.inalloc.supervisor import Supervisor, SupervisorJournal
from slurm.jobstep import parse_time_left


@dataclass
class FakeStep:
    """Runs for ``polls`` of the supervisor's waits (long enough for its standbys to be
    started on the fake clock), then ends with ``status``."""

    status: int
    pid: int = 1
    warm: list[str] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)
    polls: int = 10

    def wait(self, timeout: float | None = None) -> int | None:
        if timeout is not None and self.polls > 0:
            self.polls -= 1
            return None
        return self.status

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    def end(self) -> None:
        raise AssertionError("these launches report no progress: none is judged stalled")


@dataclass
class FakeJob:
    """A --no-kill job: each launch ends with the next status; ``faults[i]`` is what Slurm does
    to the nodes when step i ends: DOWN nodes leave the job, DRAIN ones stay until released."""

    nodes: list[str]
    statuses: list[int]
    faults: dict[int, dict[str, str]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    launches: list[list[str]] = field(default_factory=list)
    released: list[list[str]] = field(default_factory=list)
    refuse_release: bool = False
    standby: set[str] = field(default_factory=set)
    closed: bool = False
    left_s: float | None = None
    steps: list[FakeStep] = field(default_factory=list)
    held: list[tuple[str, str]] = field(default_factory=list)
    refuse_hold: bool = False

    def job_nodes(self) -> list[str]:
        return list(self.nodes)

    def bad_nodes(self, nodes: Sequence[str]) -> list[str]:
        return [n for n in nodes if self.states.get(n) in ("DOWN", "DRAIN")]

    def release(self, keep: Sequence[str]) -> None:
        if self.refuse_release:  # as Slurm does while a DOWN node is still in the job
            raise SlurmRefusedError("scontrol update JobId=1: refused: Unexpected message")
        self.released.append(list(keep))
        self.nodes = [n for n in self.nodes if n in keep]
        self.standby &= set(keep)

    def launch(self, nodes: Sequence[str], command: Sequence[str]) -> FakeStep:
        i = len(self.launches)
        self.launches.append(list(nodes))
        warm = [n for n in nodes if n in self.standby]
        self.standby -= set(nodes)
        for node, state in self.faults.get(i, {}).items():
            self.states[node] = state
            if state == "DOWN":
                self.nodes.remove(node)
                self.standby.discard(node)  # its standby's step ends with the node
        self.steps.append(FakeStep(self.statuses[i], warm=warm))
        return self.steps[-1]

    def time_left(self) -> float | None:
        return self.left_s

    def warm(self, nodes: Sequence[str], command: Sequence[str]) -> list[str]:
        started = [n for n in nodes if n not in self.standby]
        self.standby |= set(started)
        return started

    def close(self) -> None:
        self.closed = True
        self.standby.clear()

    def hold(self, node: str, reason: str) -> None:
        if self.refuse_hold:  # a job user who is not a Slurm operator
            raise SlurmRefusedError(f"scontrol update NodeName={node}: Invalid user id")
        self.held.append((node, reason))
        self.states[node] = "DRAIN"


def _run(job: FakeJob, tmp_path: Path, **kw: object) -> tuple[object, SupervisorJournal]:
    clock = iter(range(10_000))
    journal = SupervisorJournal(tmp_path / "sup.jsonl")
    sup = Supervisor(
        slurm=job,
        command=["recover", "train"],
        processes=2,
        batch_host="n1",
        journal=journal,
        clock=lambda: float(next(clock)),
        sleep=lambda _s: None,
        **kw,  # type: ignore[arg-type]
    )
    return sup.run(), journal


def test_the_batch_host_is_the_last_spare() -> None:
    layout = first_layout(["n1", "n2", "n3", "n4"], "n1", 2)
    assert layout.step == ("n2", "n3")
    assert layout.spares == ("n4", "n1")


def test_too_few_nodes_for_the_processes_is_an_error_naming_them() -> None:
    with pytest.raises(ValueError, match=r"holds 1 node\(s\) \(n1\) for 2 processes"):
        first_layout(["n1"], "n1", 2)


def test_a_down_node_is_replaced_by_a_spare_and_the_job_completes(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 0], faults={0: {"n3": "DOWN"}})
    decision, journal = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n4"]]
    assert job.released == []  # Slurm dropped the DOWN node itself
    assert [e["event"] for e in journal.events] == [
        "supervising", "launched", "standby", "step-ended", "lost", "relaunch", "launched",
        "standby", "step-ended", "finish",
    ]  # fmt: skip
    assert (tmp_path / "sup.jsonl").read_text().count("\n") == 10


def test_standbys_wait_on_every_node_and_the_relaunch_takes_them(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 0], faults={0: {"n3": "DOWN"}})
    decision, journal = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    launched = [e for e in journal.events if e["event"] == "launched"]
    standby = [e for e in journal.events if e["event"] == "standby"]
    assert launched[0]["warm"] == []  # nothing was up before the first launch
    # Every node the job still holds (the fake drops n3 as the first launch starts).
    assert standby[0]["started"] == ["n1", "n2", "n4"]
    assert launched[1]["warm"] == ["n2", "n4"]  # the survivor and the spare were up
    assert standby[1]["started"] == ["n2", "n4"]  # replaced; n1's still waits
    assert job.closed  # the job ended: no standby left
    assert not job.standby


def test_no_standby_when_the_supervisor_is_told_so(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 0], faults={0: {"n3": "DOWN"}})
    decision, journal = _run(job, tmp_path, standby_after_s=None)
    assert decision == Finish(0, "the training step completed")
    assert not [e for e in journal.events if e["event"] == "standby"]
    assert [e["warm"] for e in journal.events if e["event"] == "launched"] == [[], []]


def test_standbys_are_ended_when_the_supervisor_fails(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3"], [134], faults={0: {"n2": "DOWN"}})
    job.statuses = []  # the relaunch finds no status: the supervisor raises
    with pytest.raises(IndexError):
        _run(job, tmp_path)
    assert job.closed


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([0, 0, 0], 0),
        ([75, 75], 75),
        ([0, 75], 75),
        ([134, 76, 76], 134),  # the first to fail is the cause, the others lost a peer
        ([0, 76, 134], 76),
        ([75, 143], 143),
    ],
)
def test_a_launch_status_is_its_first_failure(statuses: list[int], expected: int) -> None:
    assert launch_status(statuses) == expected


def test_a_drained_node_is_given_back_before_the_relaunch(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3"], [137, 0], faults={0: {"n2": "DRAIN"}})
    decision, _ = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.released == [["n1", "n3"]]
    assert job.launches == [["n2", "n3"], ["n3", "n1"]]  # the batch host, last spare, trains


def test_no_spare_left_requeues(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3"], [134, 134], faults={0: {"n2": "DOWN"}, 1: {"n3": "DOWN"}})
    decision, journal = _run(job, tmp_path)
    assert isinstance(decision, Requeue)
    assert decision.lost == ("n3",)
    assert "0 spare(s) left" in decision.why
    assert decision_line(decision) == "requeue"
    assert journal.events[-1]["event"] == "requeue"


def test_the_restart_budget_bounds_relaunches(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 0], faults={0: {"n3": "DOWN"}})
    decision, _ = _run(job, tmp_path, max_relaunches=0)
    assert isinstance(decision, Requeue)
    assert "restart budget is spent (0 relaunches)" in decision.why
    assert job.launches == [["n2", "n3"]]


def test_a_failure_with_no_lost_node_ends_the_job_with_its_status(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3"], [1])
    decision, journal = _run(job, tmp_path, grace_s=3.0)
    assert decision == Finish(1, "the training step failed (status 1) and no node is lost")
    assert decision_line(decision) == "exit 1"
    (lost,) = [e for e in journal.events if e["event"] == "lost"]
    assert lost["nodes"] == []
    assert lost["waited_s"] >= 3.0  # it waited the grace for Slurm to name a node


def test_a_lost_spare_is_not_taken(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 0], faults={0: {"n2": "DOWN", "n4": "DRAIN"}})
    decision, _ = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches[1] == ["n3", "n1"]
    assert job.released == [["n1", "n3"]]


def test_preempted_and_completed_steps_end_the_job() -> None:
    layout = first_layout(["n1", "n2", "n3"], "n1", 2)
    for status in (0, 75):
        decision = after_step(
            layout, status, lost=["n2"], dropped=[], relaunches=0, max_relaunches=3
        )
        assert isinstance(decision, Finish)
        assert decision.status == status


def test_a_lost_batch_host_requeues() -> None:
    layout = first_layout(["n1", "n2", "n3"], "n1", 3)
    decision = after_step(layout, 134, lost=["n1"], dropped=[], relaunches=0, max_relaunches=3)
    assert isinstance(decision, Requeue)
    assert "batch host n1" in decision.why


def test_a_forwarded_signal_reaches_the_step_and_stops_relaunches(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3"], [75])
    sup = Supervisor(
        slurm=job,
        command=["x"],
        processes=2,
        batch_host="n1",
        journal=SupervisorJournal(tmp_path / "j"),
    )
    sup.forward(signal.SIGUSR1)  # before the step starts: passed on when it does
    decision = sup.run()
    assert isinstance(decision, Finish)
    assert decision.status == 75
    assert "SIGUSR1" in decision.why


def _signal_as_the_relaunch_starts(job: FakeJob, sup: Supervisor, signum: int) -> None:
    real_launch = job.launch

    def launch(nodes: Sequence[str], command: Sequence[str]) -> FakeStep:
        step = real_launch(nodes, command)
        if len(job.launches) == 2:
            sup.forward(signum)
        return step

    job.launch = launch  # type: ignore[method-assign]


def _sup(job: FakeJob, tmp_path: Path) -> Supervisor:
    clock = iter(range(10_000))
    return Supervisor(
        slurm=job, command=["x"], processes=2, batch_host="n1",
        journal=SupervisorJournal(tmp_path / "j"), clock=lambda: float(next(clock)),
        sleep=lambda _s: None,
    )  # fmt: skip


def test_a_signal_that_stops_a_relaunch_before_it_saves_requeues(tmp_path: Path) -> None:
    """TERM (not about a node) reaching a relaunch that is only starting: srun ends 143 and
    nothing saved. Ending the job with 143 would lose the run; it is requeued, to resume
    from the checkpoints."""
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 143], faults={0: {"n2": "DRAIN"}})
    sup = _sup(job, tmp_path)
    _signal_as_the_relaunch_starts(job, sup, signal.SIGTERM)
    decision = sup.run()
    assert isinstance(decision, Requeue)
    assert decision.why == "SIGTERM stopped the step before it could save (status 143)"
    assert decision_line(decision) == "requeue"
    assert job.steps[1].signals == [signal.SIGTERM]


def test_the_coordinators_usr1_for_a_node_the_job_left_is_ignored(tmp_path: Path) -> None:
    """The coordinator drains n2 (its training died there) and sends the job USR1 ("save and
    leave n2"); it arrives as the relaunch without n2 starts. Passing it on would stop the
    relaunch and requeue the job: it is ignored, and the job completes in its allocation."""
    job = FakeJob(["n1", "n2", "n3", "n4"], [134, 0], faults={0: {"n2": "DRAIN"}})
    sup = _sup(job, tmp_path)
    _signal_as_the_relaunch_starts(job, sup, signal.SIGUSR1)
    decision = sup.run()
    assert decision == Finish(0, "the training step completed")
    assert job.steps[1].signals == []
    (ignored,) = [e for e in sup.journal.events if e["event"] == "signal-ignored"]
    assert (ignored["signal"], ignored["lost"]) == ("SIGUSR1", ["n2"])


def test_a_usr1_for_a_draining_step_node_saves_and_relaunches_without_it(tmp_path: Path) -> None:
    """A drain with the training still alive on n3: the step saves and stops on USR1 (75),
    then the job gives n3 back and goes on, on its spare: no requeue."""
    job = FakeJob(["n1", "n2", "n3", "n4"], [75, 0], faults={0: {"n3": "DRAIN"}})
    sup = _sup(job, tmp_path)
    sup.forward(signal.SIGUSR1)  # comes while the first step runs
    decision = sup.run()
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n4"]]
    assert job.released == [["n1", "n2", "n4"]]
    assert [st.signals for st in job.steps] == [[signal.SIGUSR1], []]
    (leave,) = [e for e in sup.journal.events if e["event"] == "signal-leave"]
    assert leave["nodes"] == ["n3"]


def test_a_usr1_for_the_drained_batch_host_saves_and_ends_the_job(tmp_path: Path) -> None:
    """The job cannot give back the node its batch script runs on: the coordinator's save and
    leave for it is obeyed as before (save, and the batch script requeues the job)."""
    job = FakeJob(["n1", "n2", "n3", "n4"], [75], faults={0: {"n1": "DRAIN"}})
    sup = _sup(job, tmp_path)
    sup.forward(signal.SIGUSR1)
    decision = sup.run()
    assert decision == Finish(75, "the step ended after SIGUSR1")
    assert job.steps[0].signals == [signal.SIGUSR1]


def test_a_usr1_near_the_time_limit_is_its_warning_even_while_a_node_drains(
    tmp_path: Path,
) -> None:
    """Slurm's own USR1 comes the signal's lead (60 s) before the time limit: with so little
    time left a relaunch would not get far, so the job saves and ends (the batch script
    requeues it), whatever node drains."""
    job = FakeJob(["n1", "n2", "n3", "n4"], [75], faults={0: {"n3": "DRAIN"}}, left_s=61.0)
    sup = _sup(job, tmp_path)
    sup.forward(signal.SIGUSR1)
    decision = sup.run()
    assert decision == Finish(75, "the step ended after SIGUSR1")
    assert job.launches == [["n2", "n3"]]


def test_relaunch_keeps_survivors_first() -> None:
    layout = first_layout(["n1", "n2", "n3", "n4"], "n1", 2)
    decision = after_step(layout, 134, lost=["n2"], dropped=["n2"], relaunches=0, max_relaunches=3)
    assert decision == Relaunch(nodes=("n3", "n4"), lost=("n2",), release=(), spares_left=("n1",))


def test_a_refused_release_is_journaled_and_the_relaunch_goes_on(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3"], [134, 0], faults={0: {"n3": "DRAIN"}}, refuse_release=True)
    decision, journal = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n1"]]
    (refused,) = [e for e in journal.events if e["event"] == "release-refused"]
    assert refused["nodes"] == ["n3"]
    assert "Unexpected message" in refused["error"]


def test_a_second_fault_during_the_relaunch_takes_the_next_spare(tmp_path: Path) -> None:
    job = FakeJob(
        ["n1", "n2", "n3", "n4", "n5"],
        [134, 134, 0],
        faults={0: {"n2": "DOWN"}, 1: {"n4": "DOWN"}},
    )
    decision, journal = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n3", "n4"], ["n3", "n5"]]
    assert [e["attempt"] for e in journal.events if e["event"] == "relaunch"] == [1, 2]


def test_a_step_that_srun_reports_0_while_its_node_failed_is_relaunched(tmp_path: Path) -> None:
    """srun may exit 0 for a one-task step whose node failed under it ("srun: error: Node
    failure"): a lost node overrules the status, the step is relaunched, never taken as the
    training's completion."""
    job = FakeJob(["n1", "n2", "n3", "n4"], statuses=[0, 0], faults={0: {"n2": "DOWN"}})
    decision, journal = _run(job, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n3", "n4"]]
    (overruled,) = [e for e in journal.events if e["event"] == "status-overruled"]
    assert (overruled["status"], overruled["lost"]) == (0, ["n2"])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1:05", 65.0),
        ("2:00:01", 7201.0),
        ("1-00:00:10", 86410.0),
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
        ("", None),
        ("x-1:00", None),
    ],
)
def test_squeue_time_left(text: str, seconds: float | None) -> None:
    assert parse_time_left(text) == seconds


def test_a_process_killed_from_outside_is_relaunched_on_the_same_nodes(tmp_path: Path) -> None:
    """137 with every node in service (the OOM killer, or slurmctld's kill of a requeued
    job's old run reaching the new one on a node that came back): relaunched in place,
    within the budget; then the job ends with the status."""
    job = FakeJob(["n1", "n2", "n3"], [137, 0])
    decision, journal = _run(job, tmp_path, grace_s=1.0)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n3"]]
    assert [e["lost"] for e in journal.events if e["event"] == "relaunch"] == [[]]
    again = FakeJob(["n1", "n2", "n3"], [137])
    (tmp_path / "b").mkdir()
    decision, _ = _run(again, tmp_path / "b", grace_s=1.0, max_relaunches=0)
    assert decision == Finish(137, "the training step failed (status 137) and no node is lost")
