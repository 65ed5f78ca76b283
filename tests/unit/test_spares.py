"""The spare pool's pure parts: which nodes are spares, what retiring takes, which spare is
promoted; the pool runs against an in-memory fake of our SlurmControl port."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import pytest

from recovery.errors import NoSpareError, ReasonNotOursError, UsageError
from recovery.pool.spares import (
    SPARE_REASON,
    RetireStep,
    SparePool,
    is_ready_spare,
    is_spare,
    retire_steps,
)
from recovery.ports.slurm import BatchJob, JobInfo, NodeInfo, mark

DRAIN = frozenset({"DRAIN"})
LOST = frozenset({"NOT_RESPONDING"})


class FakeSlurm:
    """SlurmControl over a dict of nodes; records every action as ``(method, node)``."""

    def __init__(self, *nodes: NodeInfo) -> None:
        self.state = {n.name: n for n in nodes}
        self.calls: list[tuple[str, str]] = []

    def nodes(self) -> list[NodeInfo]:
        return [self.state[k] for k in sorted(self.state)]

    def node(self, name: str) -> NodeInfo:
        return self.state[name]

    def down(self, node: str, reason: str) -> bool:
        self.calls.append(("down", node))
        self.state[node] = replace(self.state[node], state="DOWN", reason=mark(reason))
        return True

    def drain(self, node: str, reason: str) -> bool:
        self.calls.append(("drain", node))
        n = self.state[node]
        self.state[node] = replace(n, flags=n.flags | DRAIN, reason=mark(reason))
        return True

    def resume(self, node: str, *, force: bool = False) -> bool:
        self.calls.append(("resume", node))
        n = self.state[node]
        if not (n.reason_is_ours or force):
            raise ReasonNotOursError(node, n.reason, n.reason_set_by)
        self.state[node] = replace(n, state="IDLE", flags=n.flags - DRAIN, reason="")
        return True

    def jobs(self) -> list[JobInfo]:
        raise NotImplementedError

    def job(self, job_id: str | int) -> JobInfo:
        raise NotImplementedError

    def jobs_on(self, node: str) -> list[JobInfo]:
        raise NotImplementedError

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        raise NotImplementedError

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        raise NotImplementedError

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        raise NotImplementedError

    def requeue(self, job_id: str | int) -> bool:
        raise NotImplementedError

    def requeue_ended(self, job_id: str | int, restart_count: int) -> bool:
        raise NotImplementedError

    def submit(self, job: BatchJob) -> str:
        raise NotImplementedError

    def cancel(self, job_id: str | int) -> bool:
        raise NotImplementedError


def spare(name: str, state: str = "IDLE", *flags: str) -> NodeInfo:
    return NodeInfo(name, state, DRAIN | set(flags), SPARE_REASON, "root")


@pytest.mark.parametrize(
    ("node", "in_pool", "ready"),
    [
        (spare("s1"), True, True),
        (spare("s1", "IDLE", "NOT_RESPONDING"), True, False),
        (spare("s1", "IDLE", "POWERED_DOWN"), True, False),
        (spare("s1", "IDLE", "COMPLETING"), True, False),
        (spare("s1", "ALLOCATED"), True, False),
        (spare("s1", "DOWN"), True, False),
        (NodeInfo("n1", "IDLE"), False, False),
        (NodeInfo("n1", "IDLE", DRAIN, "recover: xid79"), False, False),
        (NodeInfo("n1", "IDLE", frozenset(), SPARE_REASON), False, False),  # reason, no DRAIN
        (NodeInfo("n1", "IDLE", DRAIN, "spare"), False, False),  # someone else's "spare"
    ],
)
def test_pool_membership(node: NodeInfo, in_pool: bool, ready: bool) -> None:
    assert is_spare(node) is in_pool
    assert is_ready_spare(node) is ready


@pytest.mark.parametrize(
    ("node", "steps"),
    [
        (spare("s1"), []),
        (spare("s1", "DOWN"), []),  # in the pool already, if not ready
        (NodeInfo("n1", "IDLE"), ["drain"]),
        (NodeInfo("n1", "ALLOCATED"), ["drain"]),  # its job runs on; ready once idle
        (NodeInfo("n1", "IDLE", DRAIN, "recover: xid79"), ["drain"]),
        (NodeInfo("n1", "IDLE", DRAIN, ""), ["drain"]),
        (NodeInfo("n1", "DOWN", frozenset(), "recover: xid79"), ["resume", "drain"]),
        (NodeInfo("n1", "DOWN", DRAIN, "recover: xid79"), ["resume", "drain"]),
        (NodeInfo("n1", "DOWN", frozenset({"NOT_RESPONDING"}), ""), ["mark", "resume", "drain"]),
        (NodeInfo("n1", "DOWN", LOST, "Not responding", "root"), ["mark", "resume", "drain"]),
    ],
)
def test_retire_steps(node: NodeInfo, steps: list[RetireStep]) -> None:
    assert retire_steps(node) == steps


@pytest.mark.parametrize(
    "node",
    [
        NodeInfo("n1", "IDLE", DRAIN, "bios update (alice)", "alice"),
        NodeInfo("n1", "DOWN", frozenset(), "Kill task failed", "slurm"),
        NodeInfo("n1", "DOWN", DRAIN, "rma", "bob"),
    ],
)
def test_retire_refuses_a_node_held_by_someone_else(node: NodeInfo) -> None:
    with pytest.raises(ReasonNotOursError, match=re.escape(f"reason {node.reason!r}")):
        retire_steps(node)


@pytest.mark.parametrize(
    "node",
    [
        NodeInfo("n1", "IDLE"),
        NodeInfo("n1", "DOWN", frozenset(), "recover: xid79"),
        NodeInfo("n1", "DOWN", frozenset(), ""),
        NodeInfo("n1", "DOWN", LOST, "Not responding", "root"),
        NodeInfo("n1", "IDLE", DRAIN, ""),
    ],
)
def test_retire_executes_the_steps_and_lands_in_the_pool(node: NodeInfo) -> None:
    fake = FakeSlurm(node)
    pool = SparePool(fake)
    assert pool.retire("n1") is True
    assert [method for method, _ in fake.calls] == [
        {"mark": "down"}.get(s, s) for s in retire_steps(node)
    ]
    assert is_spare(fake.node("n1"))
    fake.calls.clear()
    assert pool.retire("n1") is False
    assert fake.calls == []


def test_promote_takes_the_first_ready_spare_by_name() -> None:
    fake = FakeSlurm(spare("s2"), spare("s1", "IDLE", "NOT_RESPONDING"), spare("s3"))
    pool = SparePool(fake)
    assert [n.name for n in pool.spares()] == ["s2", "s3"]
    assert pool.promote() == "s2"
    assert fake.calls == [("resume", "s2")]


def test_promote_takes_the_spare_the_caller_chose() -> None:
    fake = FakeSlurm(spare("s1"), spare("s2"))
    assert SparePool(fake).promote("s2") == "s2"
    assert fake.calls == [("resume", "s2")]


def test_promote_of_a_node_that_is_not_a_ready_spare_says_which_are() -> None:
    fake = FakeSlurm(spare("s1"), spare("s2", "IDLE", "NOT_RESPONDING"), NodeInfo("n1", "IDLE"))
    pool = SparePool(fake)
    with pytest.raises(NoSpareError, match=r"s2 is not a ready spare .*NOT_RESPONDING.*ready: s1"):
        pool.promote("s2")
    with pytest.raises(NoSpareError, match=r"n1 is not a ready spare \(n1 IDLE ''\); ready: s1"):
        pool.promote("n1")
    with pytest.raises(UsageError, match=r"Unknown node 'n9'\. Known: n1, s1, s2"):
        pool.promote("n9")
    assert fake.calls == []


def test_promote_with_an_empty_pool_says_why_and_how() -> None:
    fake = FakeSlurm(NodeInfo("n1", "IDLE"), spare("s1", "IDLE", "NOT_RESPONDING"))
    with pytest.raises(NoSpareError) as info:
        SparePool(fake).promote()
    text = str(info.value)
    assert "not ready: s1 IDLE+DRAIN+NOT_RESPONDING 'recover: spare'" in text
    assert "recover cluster retire NODE" in text
    assert fake.calls == []
