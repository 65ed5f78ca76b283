"""Idempotence under races with Slurm itself, on a scripted CliSlurm (no daemons).

Between our read and our write Slurm may reach the wanted state by itself (a slurmd registers
again and ReturnToService brings its node back; a job finishes). An action refused then
re-reads and returns False; a refusal while the state still differs is raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from recovery.errors import SlurmRefusedError, SlurmUnavailableError
from recovery.ports.slurm import JobInfo, NodeInfo
from slurm.cli_slurm import CliSlurm

DRAIN = frozenset({"DRAIN"})
NONE: frozenset[str] = frozenset()
OURS = "recover: xid79"
INVALID_STATE = "slurm_update error: Invalid node state specified"


@dataclass
class Script:
    """What the fake Slurm answers: successive ``sinfo``/``squeue`` snapshots (the last one
    repeats) and one outcome per command run (a stdout text, or the stderr of a refusal)."""

    nodes: list[list[NodeInfo]] = field(default_factory=list)
    jobs: list[list[JobInfo]] = field(default_factory=list)
    runs: list[str | Exception] = field(default_factory=list)


class ScriptedSlurm(CliSlurm):
    """CliSlurm whose reads and commands follow a :class:`Script`; records each argv run."""

    def __init__(self, script: Script) -> None:
        super().__init__("/nonexistent/slurm.conf", env={})
        self.script = script
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str], *, stdin: str | None = None) -> str:
        self.argvs.append(list(argv))
        outcome = self.script.runs.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def nodes(self) -> list[NodeInfo]:
        snaps = self.script.nodes
        return snaps.pop(0) if len(snaps) > 1 else snaps[0]

    def jobs(self) -> list[JobInfo]:
        snaps = self.script.jobs
        return snaps.pop(0) if len(snaps) > 1 else snaps[0]


def refused(stderr: str) -> SlurmRefusedError:
    return SlurmRefusedError(f"scontrol update: refused: {stderr}")


def node(state: str, flags: frozenset[str] = NONE, reason: str = "", name: str = "n1") -> NodeInfo:
    return NodeInfo(name, state, flags, reason)


# (action, node before our write, node after the refusal, whether the refusal is raised)
NODE_RACES = [
    ("resume", node("DOWN", NONE, OURS), node("IDLE"), False),
    ("resume", node("IDLE", DRAIN, OURS), node("IDLE"), False),
    ("resume", node("IDLE", DRAIN, OURS), node("IDLE", DRAIN, OURS), True),
    # The CI teardown: a forced resume of a crashed node whose slurmd registered meanwhile.
    ("force", node("DOWN", frozenset({"NOT_RESPONDING"}), "Not responding"), node("IDLE"), False),
    ("down", node("IDLE"), node("DOWN", NONE, OURS), False),
    ("down", node("IDLE"), node("DOWN", NONE, "rma"), False),  # someone else's now: theirs kept
    ("down", node("IDLE"), node("DOWN", NONE, "Not responding"), True),  # ours is still missing
    ("down", node("IDLE"), node("IDLE"), True),
    ("drain", node("IDLE"), node("IDLE", DRAIN, OURS), False),
    ("drain", node("IDLE"), node("DOWN", NONE, OURS), True),
]


@pytest.mark.parametrize(("action", "before", "after", "raises"), NODE_RACES)
def test_a_refused_node_action_rereads(
    action: str, before: NodeInfo, after: NodeInfo, raises: bool
) -> None:
    ctl = ScriptedSlurm(Script(nodes=[[before], [after]], runs=[refused(INVALID_STATE)]))
    calls = {
        "resume": lambda: ctl.resume("n1"),
        "force": lambda: ctl.resume("n1", force=True),
        "down": lambda: ctl.down("n1", "xid79"),
        "drain": lambda: ctl.drain("n1", "xid79"),
    }
    if raises:
        with pytest.raises(SlurmRefusedError, match="Invalid node state"):
            calls[action]()
    else:
        assert calls[action]() is False
    assert len(ctl.argvs) == 1  # never retried blindly


def test_a_transient_failure_is_raised_without_a_second_look() -> None:
    ctl = ScriptedSlurm(
        Script(nodes=[[node("DOWN", NONE, OURS)]], runs=[SlurmUnavailableError("timed out")])
    )
    with pytest.raises(SlurmUnavailableError):
        ctl.resume("n1")


def two(first: NodeInfo, second: NodeInfo) -> list[NodeInfo]:
    return [replace(first, name="n1"), replace(second, name="n2")]


def test_down_many_writes_once_for_all_nodes_that_need_it() -> None:
    before = [*two(node("IDLE"), node("DOWN", NONE, OURS)), NodeInfo("n3", "IDLE")]
    ctl = ScriptedSlurm(Script(nodes=[before], runs=[""]))
    assert ctl.down_many(["n3", "n1", "n2", "n1"], "xid79") == ["n1", "n3"]
    assert ctl.argvs == [["scontrol", "update", "NodeName=n1,n3", "State=DOWN", f"Reason={OURS}"]]


def test_down_many_refused_because_it_already_holds_changes_nothing() -> None:
    before = two(node("IDLE"), node("IDLE"))
    after = two(node("DOWN", NONE, OURS), node("DOWN", NONE, OURS))
    ctl = ScriptedSlurm(Script(nodes=[before, after], runs=[refused(INVALID_STATE)]))
    assert ctl.down_many(["n1", "n2"], "xid79") == []


def test_drain_many_refused_while_a_node_still_differs_is_raised() -> None:
    before = two(node("IDLE"), node("IDLE"))
    after = two(node("IDLE", DRAIN, OURS), node("IDLE"))
    ctl = ScriptedSlurm(Script(nodes=[before, after], runs=[refused(INVALID_STATE)]))
    with pytest.raises(SlurmRefusedError):
        ctl.drain_many(["n1", "n2"], "xid79")


def job(state: str) -> list[JobInfo]:
    return [JobInfo("7", "train", state, ("n1",))]


# (action, job before, job after the refusal (None: forgotten), whether it is raised)
JOB_RACES: list[tuple[str, str, str | None, bool]] = [
    ("requeue", "RUNNING", "PENDING", False),
    ("requeue", "RUNNING", "RUNNING", True),
    ("cancel", "RUNNING", "CANCELLED", False),
    ("cancel", "RUNNING", "COMPLETED", False),
    ("cancel", "RUNNING", None, False),
    ("cancel", "RUNNING", "RUNNING", True),
    ("signal", "RUNNING", "COMPLETED", False),
    ("signal", "RUNNING", None, False),
    ("signal", "RUNNING", "RUNNING", True),
]


@pytest.mark.parametrize(("action", "before", "after", "raises"), JOB_RACES)
def test_a_refused_job_action_rereads(
    action: str, before: str, after: str | None, raises: bool
) -> None:
    later = [] if after is None else job(after)
    ctl = ScriptedSlurm(Script(jobs=[job(before), later], runs=[refused("Some refusal")]))
    calls = {
        "requeue": lambda: ctl.requeue("7"),
        "cancel": lambda: ctl.cancel("7"),
        "signal": lambda: ctl.signal_job("7", "USR1"),
    }
    if raises:
        with pytest.raises(SlurmRefusedError, match="Some refusal"):
            calls[action]()
    else:
        assert calls[action]() is False
    assert len(ctl.argvs) == 1


def test_requeue_answered_job_is_pending_execution_already_holds() -> None:
    # Right after a requeue the job is still COMPLETING on its old node.
    ctl = ScriptedSlurm(
        Script(jobs=[job("RUNNING"), job("COMPLETING")], runs=[refused("Job is pending execution")])
    )
    assert ctl.requeue("7") is False


@pytest.mark.parametrize("state", ["PENDING", "COMPLETED", "CANCELLED"])
def test_signal_to_a_job_that_is_not_running_sends_nothing(state: str) -> None:
    ctl = ScriptedSlurm(Script(jobs=[job(state)]))
    assert ctl.signal_job("7", "USR1") is False
    assert ctl.argvs == []


def test_signal_reaches_the_batch_step_only() -> None:
    ctl = ScriptedSlurm(Script(jobs=[job("RUNNING")], runs=[""]))
    assert ctl.signal_job("7", "USR1") is True
    assert ctl.argvs == [["scancel", "--signal=USR1", "--batch", "7"]]
