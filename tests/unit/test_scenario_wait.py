"""The scenario runner's wait on a trigger: a job a fault just ended (FAILED, about to be
requeued by the coordinator) must not end the wait; a job over for good must."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from scenarios import runner


class _Script:
    """A stand-in for the runner's Watcher: each poll moves the job to its next state."""

    def __init__(self, states: list[str]) -> None:
        self.states = list(states)
        self.job: SimpleNamespace | None = None
        self.incidents: list[dict[str, object]] = [{"status": "closed"}]
        self.polls = 0

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
