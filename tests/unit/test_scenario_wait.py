"""The scenario runner's wait on a trigger: a job a fault just ended (FAILED, about to be
requeued by the coordinator) must not end the wait; a job over for good must. And when the
``job: requeued`` trigger fires."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from recovery.ports.slurm import JobInfo
from scenarios import runner
from scenarios.watch import Watcher


class _Script:
    """A stand-in for the runner's Watcher: each poll moves the job to its next state."""

    def __init__(self, states: list[str]) -> None:
        self.states = list(states)
        self.job: SimpleNamespace | None = None
        self.incidents: list[dict[str, object]] = [{"status": "closed"}]
        self.polls = 0
        self.first_step_seen: float | None = None

    def poll(self, *, force: bool = False) -> None:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        finished = state not in ("PENDING", "RUNNING")
        self.job = SimpleNamespace(state=state, finished=finished)
        self.polls += 1

    poll_events = poll


def test_a_failed_job_on_its_way_to_a_requeue_does_not_end_the_wait() -> None:
    watch = _Script(["RUNNING", "FAILED", "FAILED", "PENDING"])
    runner._wait(watch, time.monotonic() + 30, "the job requeued",  # type: ignore[arg-type]
                 lambda: watch.job is not None and watch.job.state == "PENDING",
                 fatal_end=True, interval_s=0.0)  # fmt: skip
    assert watch.polls == 4


def test_a_completed_job_ends_the_wait_at_once() -> None:
    watch = _Script(["RUNNING", "COMPLETED"])
    with pytest.raises(runner.ScenarioTimeout, match=r"the job ended \(COMPLETED\)"):
        runner._wait(watch, time.monotonic() + 30, "step 99",  # type: ignore[arg-type]
                     lambda: False, fatal_end=True, interval_s=0.0)  # fmt: skip
    assert watch.polls == 2


def test_a_failed_job_never_requeued_ends_the_wait_after_the_settle_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "ENDED_SETTLE_S", 0.05)
    watch = _Script(["RUNNING", "FAILED"])
    with pytest.raises(runner.ScenarioTimeout, match=r"the job ended \(FAILED\)"):
        runner._wait(watch, time.monotonic() + 30, "the job requeued",  # type: ignore[arg-type]
                     lambda: False, fatal_end=True, interval_s=0.01)  # fmt: skip
    assert watch.polls > 2


def test_without_fatal_end_an_ended_job_waits_for_the_deadline() -> None:
    watch = _Script(["COMPLETED"])
    with pytest.raises(runner.ScenarioTimeout, match="timed out waiting for x"):
        runner._wait(watch, time.monotonic() + 0.05, "x",  # type: ignore[arg-type]
                     lambda: False, interval_s=0.01)  # fmt: skip


# --- the `job: requeued` trigger -----------------------------------------------------------


def _watcher(tmp_path: Path, state: str, restarts: int, started_runs: list[int]) -> Watcher:
    watch = Watcher(tmp_path, "1", slurm=None, client=None, say=print)  # type: ignore[arg-type]
    watch.job = JobInfo("1", "train", state, restart_count=restarts)
    watch.job_was_running = True
    watch.events = [{"event": "started", "restart_count": r} for r in started_runs]
    return watch


@pytest.mark.parametrize(
    ("state", "restarts", "started", "fired"),
    [
        ("PENDING", 1, [0], True),  # back in the queue
        ("RUNNING", 1, [0], True),  # 25.11: given nodes again at once, training not started
        ("RUNNING", 1, [0, 1], False),  # the new run's training started: too late
        ("RUNNING", 0, [0], False),  # the first run, still running
        ("RUNNING", 0, [], False),  # the first run, its training not started yet
        ("COMPLETED", 1, [0], False),  # over
        ("FAILED", 0, [0], False),  # ended, not requeued (yet)
    ],
)
def test_requeued(
    tmp_path: Path, state: str, restarts: int, started: list[int], fired: bool
) -> None:
    assert _watcher(tmp_path, state, restarts, started).requeued() is fired


def test_not_requeued_while_a_training_process_lives(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".lock").write_text(str(os.getpid()))
    assert _watcher(tmp_path, "PENDING", 1, [0]).requeued() is False


def test_the_deadline_counts_the_scenarios_time_from_the_first_step() -> None:
    """Start-up is the machine's: a run whose job took 200 s to its first step still has its
    whole ``timeout_s`` for the scenario; before the first step, START_UP_S bounds it."""
    d = runner.Deadline(started=1000.0, run_s=170.0)
    assert d.at(None) == 1000.0 + runner.START_UP_S
    assert d.at(1200.0) == 1200.0 + 170.0
    # A first step soon after the start never shortens what start-up was promised.
    assert d.at(1010.0) == 1000.0 + runner.START_UP_S
    # A scenario longer than START_UP_S keeps its own time before the first step too.
    assert runner.Deadline(1000.0, 900.0).at(None) == 1900.0


def test_a_wait_past_the_deadline_after_the_first_step_times_out() -> None:
    watch = _Script(["RUNNING"])
    watch.first_step_seen = time.monotonic() - 10
    deadline = runner.Deadline(started=time.monotonic() - runner.START_UP_S - 1, run_s=5.0)
    with pytest.raises(runner.ScenarioTimeout, match="timed out waiting for step 99"):
        runner._wait(watch, deadline, "step 99", lambda: False,  # type: ignore[arg-type]
                     interval_s=0.0)  # fmt: skip
    assert watch.polls == 1


# --- the supervisor's journal, followed ------------------------------------------------------


def test_the_supervisors_decisions_become_progress_lines_as_they_are_written(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    said: list[str] = []
    watch = Watcher(run_dir, "7", slurm=None, client=None, say=said.append)  # type: ignore[arg-type]
    watch.poll_events()  # nothing written yet: nothing said, nothing fails
    journal = tmp_path / "supervisor-7.jsonl"
    lines = [
        {"event": "launched", "attempt": 0, "nodes": ["node2", "node3"]},
        {"event": "step-ended", "attempt": 0, "status": 76},
        {"event": "lost", "nodes": ["node3"]},
        {"event": "spare-rejected", "node": "node6", "reason": "recover: check failed: agent"},
        {"event": "relaunch", "attempt": 1, "lost": ["node3"], "step_nodes": ["node2", "node1"]},
    ]
    with journal.open("w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in lines))
        f.write('{"event": "requeue", "why": "cut')  # a line still being written
    watch.poll_events()
    assert said == [
        "supervisor: launch 0 ended with status 76",
        "supervisor: lost node3",
        "supervisor: spare node6 rejected: recover: check failed: agent",
        "supervisor: relaunch 1 on node2,node1 without node3",
    ]
    with journal.open("a") as f:
        f.write(' short"}\n')
    watch.poll_events()
    assert said[-1] == "supervisor: requeue: cut short"
    assert [e["event"] for e in watch.supervisor][-1] == "requeue"
    assert len(watch.supervisor) == 6
