"""The job supervisor's rules as pure functions (recovery/inalloc/decide.py), each on literal
statuses and node lists: no fake Slurm, no clock."""

from __future__ import annotations

import signal

import pytest

from recovery.contract.exits import (
    EXIT_FAILED,
    EXIT_KILLED,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    signal_status,
)
from recovery.errors import PeerLostError
from recovery.inalloc.decide import (
    RECENT_LOSS_S,
    TIME_LIMIT_MARGIN_S,
    Finish,
    Relaunch,
    Requeue,
    after_signal,
    after_signalled_step,
    checked_status,
    decision_line,
    ended_cleanly,
    exit_status,
    first_layout,
    leave_step,
    lost_among,
    lost_wait_over,
    status_after_leaving,
    time_limit_warning,
    usr1_about,
)

LAYOUT = first_layout(["n1", "n2", "n3", "n4"], "n1", 2)  # step n2, n3; spares n4, n1


def test_the_statuses_are_named_once_with_their_numbers() -> None:
    assert (EXIT_PREEMPTED, EXIT_PEER_LOST, EXIT_KILLED, EXIT_FAILED) == (75, 76, 137, 1)
    assert PeerLostError.exit_code == EXIT_PEER_LOST
    assert signal_status(signal.SIGTERM) == 143


@pytest.mark.parametrize(("status", "clean"), [(0, True), (75, True), (1, False), (137, False)])
def test_completed_and_saved_are_the_clean_ends(status: int, clean: bool) -> None:
    assert ended_cleanly(status) is clean


def test_dropped_nodes_come_first_and_are_not_listed_twice() -> None:
    lost, dropped = lost_among(["n2", "n3", "n4"], held={"n1", "n3", "n4"}, bad=["n4", "n2"])
    assert (lost, dropped) == (["n2", "n4"], ["n2"])


@pytest.mark.parametrize(
    ("status", "step_lost", "expected"),
    [
        (0, ["n2"], EXIT_FAILED),  # srun said 0 for a step whose node failed under it
        (75, ["n2"], EXIT_FAILED),
        (0, [], 0),
        (75, [], 75),
        (134, ["n2"], 134),  # a failure keeps its own status
    ],
)
def test_a_clean_status_with_a_lost_step_node_is_overruled(
    status: int, step_lost: list[str], expected: int
) -> None:
    assert checked_status(status, step_lost) == expected


@pytest.mark.parametrize(("status", "expected"), [(0, EXIT_FAILED), (75, EXIT_FAILED), (76, 76)])
def test_a_step_that_left_a_node_is_relaunched_as_a_failure(status: int, expected: int) -> None:
    assert status_after_leaving(status) == expected


def test_the_wait_for_a_lost_node_ends_with_a_step_node_or_the_grace() -> None:
    assert lost_wait_over(LAYOUT, ["n3"], waited_s=0.0, grace_s=30.0)
    assert not lost_wait_over(LAYOUT, ["n4"], waited_s=29.9, grace_s=30.0)  # a spare only
    assert lost_wait_over(LAYOUT, [], waited_s=30.0, grace_s=30.0)


def test_a_usr1_close_to_the_time_limit_is_its_warning() -> None:
    assert time_limit_warning(60.0 + TIME_LIMIT_MARGIN_S, signal_lead_s=60.0)
    assert not time_limit_warning(60.0 + TIME_LIMIT_MARGIN_S + 1, signal_lead_s=60.0)
    assert not time_limit_warning(None, signal_lead_s=60.0)  # no limit: never the warning


def test_a_usr1_is_about_the_nodes_lost_now_or_lately() -> None:
    assert usr1_about(["n3"], "n1", None, ()) == ("n3",)
    assert usr1_about(["n3", "n1"], "n1", None, ()) is None  # the batch host: leave the job
    assert usr1_about([], "n1", RECENT_LOSS_S, ["n2"]) == ("n2",)
    assert usr1_about([], "n1", RECENT_LOSS_S + 1, ["n2"]) is None
    assert usr1_about([], "n1", None, ()) is None  # no loss: an operator's


def test_only_the_nodes_the_step_trains_on_are_left() -> None:
    assert leave_step(LAYOUT, ["n3", "n4"]) == ("n3",)
    assert leave_step(LAYOUT, ["n4"]) == ()  # the job trains on none: ignored


def test_a_signalled_step_ends_with_its_save_or_requeues() -> None:
    assert after_signal(75, "SIGUSR1") == Finish(75, "the step ended after SIGUSR1")
    assert after_signal(143, "SIGTERM") == Requeue(
        (), "SIGTERM stopped the step before it could save (status 143)"
    )


def test_a_signalled_step_waits_for_no_lost_node() -> None:
    decided = after_signalled_step(LAYOUT, 143, "SIGTERM", relaunches=0, max_relaunches=3)
    assert isinstance(decided, Requeue)
    # SIGKILLed from outside within the budget: relaunched in place, as without a signal.
    killed = after_signalled_step(LAYOUT, EXIT_KILLED, "SIGUSR1", relaunches=0, max_relaunches=3)
    assert killed == Relaunch(nodes=("n2", "n3"), lost=(), release=(), spares_left=("n4", "n1"))


def test_the_batch_script_is_told_the_final_decision_and_its_status() -> None:
    assert (decision_line(Finish(75, "")), exit_status(Finish(75, ""))) == ("exit 75", 75)
    assert (decision_line(Requeue((), "")), exit_status(Requeue((), ""))) == ("requeue", 0)
    relaunch = Relaunch(nodes=("n2",), lost=(), release=(), spares_left=())
    for tell in (decision_line, exit_status):
        with pytest.raises(ValueError, match="not a final decision"):
            tell(relaunch)
