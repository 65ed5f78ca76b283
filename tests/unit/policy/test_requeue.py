"""The pure rules for jobs a fault ended: which jobs, the window's edges, the budget, the
do-not-restart status, and the policy file's ``requeue`` section."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recovery.contract.exits import EXIT_DO_NOT_RESTART, EXIT_PREEMPTED
from recovery.policy import PolicyConfig, PolicyFileError, load_policy_config
from recovery.policy.requeue import (
    ABNORMAL_END_STATES,
    RequeueConfig,
    budget_used,
    describe_end,
    ended_on,
    held_by_slurm,
    judge,
)
from recovery.ports.slurm import JobInfo

T = 1_800_000_000.0
FAILED = JobInfo("7", "train", "FAILED", ("n1", "n2"), 2, exit_code=134, end_time=T)
CONFIG = RequeueConfig()
#: Run 2 failed and Slurm 25.11 requeued it expedited but holds it (no Epilog failed).
HELD = JobInfo("7", "train", "REQUEUE_HOLD", (), 3, reason="JobHeldUser", exit_code=134)


def test_the_two_exit_statuses_differ_and_are_plain_numbers() -> None:
    assert (EXIT_PREEMPTED, EXIT_DO_NOT_RESTART) == (75, 93)


def test_a_failed_run_on_the_node_is_requeued() -> None:
    verdict = judge(FAILED, 2, used=0, config=CONFIG)
    assert verdict is not None
    assert (verdict.requeue, verdict.why) == (True, "FAILED exit 134")


@pytest.mark.parametrize("state", sorted(ABNORMAL_END_STATES))
def test_every_abnormal_end_counts(state: str) -> None:
    verdict = judge(replace(FAILED, state=state), 2, used=0, config=CONFIG)
    assert verdict is not None
    assert verdict.requeue


@pytest.mark.parametrize(
    "job",
    [
        replace(FAILED, state="RUNNING"),  # still live
        replace(FAILED, state="COMPLETING"),  # ending: judged once it ended
        replace(FAILED, state="PENDING", restart_count=3),  # requeued already
        replace(FAILED, restart_count=3),  # failed again after a requeue: another run
        replace(FAILED, state="COMPLETED", exit_code=0),
        replace(FAILED, state="CANCELLED"),
        replace(FAILED, state="TIMEOUT"),
        replace(FAILED, state="OUT_OF_MEMORY"),
        replace(FAILED, state="PREEMPTED"),
        replace(HELD, restart_count=4),  # held after a later run: not the node's run
        replace(HELD, restart_count=2),
    ],
)
def test_not_ours_to_judge(job: JobInfo) -> None:
    assert judge(job, 2, used=0, config=CONFIG) is None


def test_the_do_not_restart_status_is_refused_with_its_reason() -> None:
    verdict = judge(replace(FAILED, exit_code=EXIT_DO_NOT_RESTART), 2, used=0, config=CONFIG)
    assert verdict is not None
    assert (verdict.requeue, verdict.why) == (
        False,
        "FAILED exit 93: exit 93 asks not to be restarted",
    )


def test_a_signal_is_not_the_do_not_restart_status() -> None:
    # 93 is the exit status, not a signal number: a batch shell killed by a signal is the
    # fault's like any other failure.
    verdict = judge(replace(FAILED, exit_code=0, signal=9), 2, used=0, config=CONFIG)
    assert verdict is not None
    assert verdict.requeue


def test_a_no_requeue_job_is_refused() -> None:
    job = replace(FAILED, state="NODE_FAIL", exit_code=0, signal=15, requeueable=False)
    verdict = judge(job, 2, used=0, config=CONFIG)
    assert verdict is not None
    assert not verdict.requeue
    assert (
        verdict.why
        == "NODE_FAIL signal 15: submitted with --no-requeue, so Slurm will not requeue it"
    )


@pytest.mark.parametrize(("used", "requeue"), [(0, True), (2, True), (3, False), (7, False)])
def test_the_budget(used: int, requeue: bool) -> None:
    verdict = judge(FAILED, 2, used=used, config=CONFIG)
    assert verdict is not None
    assert verdict.requeue is requeue


def test_a_budget_of_zero_never_requeues() -> None:
    verdict = judge(FAILED, 2, used=0, config=RequeueConfig(budget=0))
    assert verdict is not None
    assert not verdict.requeue


def test_the_budget_counts_only_its_window() -> None:
    config = RequeueConfig(budget_window_s=3600)
    at = [T - 4000, T - 3600, T - 3599, T - 1, T]
    assert budget_used(at, T, config) == 3  # the one exactly 3600 s old has slid out
    assert budget_used([], T, config) == 0


@pytest.mark.parametrize(
    ("end_time", "node", "matches"),
    [
        (T - 120, "n1", True),  # the window's edge is in
        (T - 120.001, "n1", False),
        (T, "n2", True),
        (T + 5, "n1", True),  # after the fault, until the bound
        (T + 60.001, "n1", False),
        (T, "n3", False),  # never ran there
        (0.0, "n1", False),  # Slurm gave no end time
    ],
)
def test_ended_on_the_node_within_the_window(end_time: float, node: str, matches: bool) -> None:
    job = replace(FAILED, end_time=end_time)
    assert ended_on(job, node, T - CONFIG.window_s, T + 60) is matches


def test_ended_on_needs_an_abnormal_end() -> None:
    assert not ended_on(replace(FAILED, state="COMPLETED"), "n1", T - 1, T + 1)


@pytest.mark.parametrize(
    ("job", "text"),
    [
        (FAILED, "FAILED exit 134"),
        (replace(FAILED, exit_code=0, signal=9), "FAILED signal 9"),
        (replace(FAILED, state="NODE_FAIL", exit_code=None), "NODE_FAIL"),
    ],
)
def test_describe_end(job: JobInfo, text: str) -> None:
    assert describe_end(job) == text


def test_the_policy_file_sets_the_requeue_section(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("requeue: {window_s: 60, budget: 5, budget_window_s: 7200}\n")
    assert load_policy_config(path).requeue == RequeueConfig(60, 5, 7200)
    assert load_policy_config(None).requeue == RequeueConfig(120, 3, 3600)
    assert PolicyConfig.default().fingerprint() != load_policy_config(path).fingerprint()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("requeue: {windw_s: 60}", r"requeue: unknown key 'windw_s'.*window_s"),
        ("requeue: {budget: -1}", r"requeue: budget: expected a whole number >= 0"),
        ("requeue: {budget: 1.5}", r"requeue: budget: expected a whole number"),
        ("requeue: {window_s: -5}", r"requeue: window_s: expected a number >= 0"),
        ("requeue: {budget_window_s: 0}", r"requeue: budget_window_s: expected a number > 0"),
        ("requeue: 3", r"requeue"),
    ],
)
def test_bad_requeue_sections_name_what_is_valid(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text + "\n")
    with pytest.raises(PolicyFileError, match=message):
        load_policy_config(path)


def test_a_run_slurm_holds_is_judged_as_a_failed_one() -> None:
    assert held_by_slurm(HELD, 2)
    assert not held_by_slurm(HELD, 3)
    assert not held_by_slurm(replace(HELD, state="PENDING"), 2)
    # Released: Slurm shows REQUEUE_HOLD until the job starts, without the hold's reason.
    assert not held_by_slurm(replace(HELD, reason="None", exit_code=0), 2)
    verdict = judge(HELD, 2, used=0, config=CONFIG)
    assert verdict is not None
    assert (verdict.requeue, verdict.why) == (True, "FAILED exit 134, held by Slurm")
    refused = judge(replace(HELD, exit_code=EXIT_DO_NOT_RESTART), 2, used=0, config=CONFIG)
    assert refused is not None
    assert not refused.requeue
    spent = judge(HELD, 2, used=CONFIG.budget, config=CONFIG)
    assert spent is not None
    assert not spent.requeue
