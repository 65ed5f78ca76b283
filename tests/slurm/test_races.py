"""Idempotence under races with Slurm itself, on each backend with scripted reads and requests
(no daemons).

Between our read and our write Slurm may reach the wanted state by itself (a slurmd registers
again and ReturnToService brings its node back; a job finishes). An action refused then
re-reads and returns False; a refusal while the state still differs is raised. Each test runs
on each backend (``backend``: cli, rest on 22.05's v0.0.38, rest@25.11 on v0.0.44); what a
backend cannot do must fail with SlurmUnsupportedError (``writes`` markers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from recovery.errors import SlurmRefusedError, SlurmUnavailableError
from recovery.ports.slurm import JobInfo, NodeInfo
from slurm.cli_slurm import CliSlurm
from slurm.control import SlurmBase
from slurm.rest_slurm import UNSUPPORTED, V38, V44, RestSlurm
from tests.slurm.helpers import expect_unsupported

DRAIN = frozenset({"DRAIN"})
NONE: frozenset[str] = frozenset()
OURS = "recover: xid79"
INVALID_STATE = "slurm_update error: Invalid node state specified"


@dataclass
class Script:
    """What the fake Slurm answers: successive node and job snapshots (the last one repeats)
    and one outcome per request sent (a reply text, or the error it raises)."""

    nodes: list[list[NodeInfo]] = field(default_factory=list)
    jobs: list[list[JobInfo]] = field(default_factory=list)
    runs: list[str | Exception] = field(default_factory=list)

    def next_nodes(self) -> list[NodeInfo]:
        return self.nodes.pop(0) if len(self.nodes) > 1 else self.nodes[0]

    def next_jobs(self) -> list[JobInfo]:
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]

    def outcome(self) -> str:
        result = self.runs.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


class ScriptedCli(CliSlurm):
    """CliSlurm whose reads and commands follow a :class:`Script`; ``writes`` records each
    argv run."""

    def __init__(self, script: Script) -> None:
        super().__init__("/nonexistent/slurm.conf", env={})
        self.script = script
        self.writes: list[Any] = []

    def run(self, argv: Sequence[str], *, stdin: str | None = None) -> str:
        self.writes.append(list(argv))
        return self.script.outcome()

    def nodes(self) -> list[NodeInfo]:
        return self.script.next_nodes()

    def jobs(self) -> list[JobInfo]:
        return self.script.next_jobs()


class ScriptedRest(RestSlurm):
    """RestSlurm whose reads and requests follow a :class:`Script`; ``writes`` records each
    request sent as (method, path, query). It speaks 22.05's v0.0.38."""

    speaks = V38

    def __init__(self, script: Script) -> None:
        super().__init__(socket="/nonexistent/slurmrestd.socket", env={}, version=self.speaks)
        self.script = script
        self.writes: list[Any] = []

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        accept: Callable[[str], bool] = lambda _: False,
    ) -> str:
        self.writes.append((method, path, dict(params or {})))
        return self.script.outcome()

    def nodes(self) -> list[NodeInfo]:
        return self.script.next_nodes()

    def jobs(self) -> list[JobInfo]:
        return self.script.next_jobs()


class ScriptedRest44(ScriptedRest):
    """ScriptedRest speaking Slurm 25.11's v0.0.44 (node updates, batch-only signals)."""

    speaks = V44
    unsupported = UNSUPPORTED[V44]


Scripted = ScriptedCli | ScriptedRest
BACKEND_CLASSES: dict[str, type[Scripted]] = {
    "cli": ScriptedCli, "rest": ScriptedRest, "rest@25.11": ScriptedRest44,
}  # fmt: skip


@pytest.fixture(params=list(BACKEND_CLASSES))
def scripted(request: pytest.FixtureRequest) -> Callable[[Script], Scripted]:
    """Build the backend under test on a script (applies the ``writes`` marker's rule)."""
    cls = BACKEND_CLASSES[request.param]
    expect_unsupported(request, cls)  # its class says what it cannot do

    def make(script: Script) -> Scripted:
        return cls(script)

    return make


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


@pytest.mark.writes("resume", "down", "drain")
@pytest.mark.parametrize(("action", "before", "after", "raises"), NODE_RACES)
def test_a_refused_node_action_rereads(
    scripted: Callable[[Script], Scripted],
    action: str,
    before: NodeInfo,
    after: NodeInfo,
    raises: bool,
) -> None:
    ctl = scripted(Script(nodes=[[before], [after]], runs=[refused(INVALID_STATE)]))
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
    assert len(ctl.writes) == 1  # never retried blindly


@pytest.mark.writes("resume")
def test_a_transient_failure_is_raised_without_a_second_look(
    scripted: Callable[[Script], Scripted],
) -> None:
    ctl = scripted(
        Script(nodes=[[node("DOWN", NONE, OURS)]], runs=[SlurmUnavailableError("timed out")])
    )
    with pytest.raises(SlurmUnavailableError):
        ctl.resume("n1")


def two(first: NodeInfo, second: NodeInfo) -> list[NodeInfo]:
    return [replace(first, name="n1"), replace(second, name="n2")]


def test_down_many_writes_once_for_all_nodes_that_need_it() -> None:
    before = [*two(node("IDLE"), node("DOWN", NONE, OURS)), NodeInfo("n3", "IDLE")]
    ctl = ScriptedCli(Script(nodes=[before], runs=[""]))
    assert ctl.down_many(["n3", "n1", "n2", "n1"], "xid79") == ["n1", "n3"]
    assert ctl.writes == [["scontrol", "update", "NodeName=n1,n3", "State=DOWN", f"Reason={OURS}"]]


@pytest.mark.writes("down_many")
def test_down_many_refused_because_it_already_holds_changes_nothing(
    scripted: Callable[[Script], Scripted],
) -> None:
    before = two(node("IDLE"), node("IDLE"))
    after = two(node("DOWN", NONE, OURS), node("DOWN", NONE, OURS))
    ctl = scripted(Script(nodes=[before, after], runs=[refused(INVALID_STATE)]))
    assert ctl.down_many(["n1", "n2"], "xid79") == []


@pytest.mark.writes("drain_many")
def test_drain_many_refused_while_a_node_still_differs_is_raised(
    scripted: Callable[[Script], Scripted],
) -> None:
    before = two(node("IDLE"), node("IDLE"))
    after = two(node("IDLE", DRAIN, OURS), node("IDLE"))
    ctl = scripted(Script(nodes=[before, after], runs=[refused(INVALID_STATE)]))
    with pytest.raises(SlurmRefusedError):
        ctl.drain_many(["n1", "n2"], "xid79")


def job(state: str) -> list[JobInfo]:
    return [JobInfo("7", "train", state, ("n1",))]


REQUEUES = pytest.mark.writes("requeue")
# (action, job before, job after the refusal (None: forgotten), whether it is raised)
JOB_RACES: list[Any] = [
    pytest.param("requeue", "RUNNING", "PENDING", False, marks=REQUEUES),
    pytest.param("requeue", "RUNNING", "RUNNING", True, marks=REQUEUES),
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
    scripted: Callable[[Script], Scripted],
    action: str,
    before: str,
    after: str | None,
    raises: bool,
) -> None:
    later = [] if after is None else job(after)
    ctl = scripted(Script(jobs=[job(before), later], runs=[refused("Some refusal")]))
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
    assert len(ctl.writes) == 1


@REQUEUES
def test_requeue_answered_job_is_pending_execution_already_holds(
    scripted: Callable[[Script], Scripted],
) -> None:
    # Right after a requeue the job is still COMPLETING on its old node.
    ctl = scripted(
        Script(jobs=[job("RUNNING"), job("COMPLETING")], runs=[refused("Job is pending execution")])
    )
    assert ctl.requeue("7") is False


@pytest.mark.parametrize("state", ["PENDING", "COMPLETED", "CANCELLED"])
def test_signal_to_a_job_that_is_not_running_sends_nothing(
    scripted: Callable[[Script], Scripted], state: str
) -> None:
    ctl = scripted(Script(jobs=[job(state)]))
    assert ctl.signal_job("7", "USR1") is False
    assert ctl.writes == []


def test_requeue_of_a_pending_job_sends_nothing(scripted: Callable[[Script], Scripted]) -> None:
    # A no-op, so it holds even where the backend could not requeue at all.
    ctl = scripted(Script(jobs=[job("PENDING")]))
    assert ctl.requeue("7") is False
    assert ctl.writes == []


#: The one request a signal is, per backend: the CLI reaches the batch shell only (the sbatch
#: wrapper forwards it); slurmrestd 22.05 signals the whole job (KILL_FULL_JOB).
SIGNAL_REQUEST: dict[type[SlurmBase], Any] = {
    ScriptedCli: [["scancel", "--signal=USR1", "--batch", "7"]],
    ScriptedRest: [("DELETE", "/job/7", {"signal": "USR1"})],
    ScriptedRest44: [("DELETE", "/job/7", {"signal": "USR1", "flags": "BATCH_JOB"})],
}


def test_signal_is_one_request(scripted: Callable[[Script], Scripted]) -> None:
    ctl = scripted(Script(jobs=[job("RUNNING")], runs=[""]))
    assert ctl.signal_job("7", "USR1") is True
    assert ctl.writes == SIGNAL_REQUEST[type(ctl)]
