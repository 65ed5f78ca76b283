"""The SlurmControl contract, one set of cases for the fake and the real daemons.

Each case runs against ``fake`` (tests/fakes/slurm.py: the fast tier, what the engine's unit
tests stand on) and against the session's real clusters through ``cli`` and ``rest`` on
22.05 and ``cli``, ``rest`` and ``pyslurm`` on 25.11 (marked ``slurm``). A case says what
someone else did (:meth:`Side.hold`, an admin's ``scontrol update``), then what our port does
about it; the fake passes only if it does what the real
adapter does. On REST (Slurm 22.05: no node updates, no requeue) a case marked ``writes(...)``
must fail with SlurmUnsupportedError and nothing else (tests/slurm/helpers.py).

The real cluster is the session one (``slurm_ctl`` resets it around each case): node1-3 in
service, spare1 drained as our spare. The fake starts with the same layout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from recovery.errors import ReasonNotOursError, SlurmRefusedError, UsageError
from recovery.pool.spares import SPARE_REASON
from recovery.ports.slurm import BatchJob, SlurmControl
from slurm.cli_slurm import CliSlurm
from slurm.rest_slurm import RestSlurm
from tests.fakes.slurm import FakeSlurm
from tests.plugins.slurm_cluster import BACKENDS, backend_for, split_backend
from tests.slurm.helpers import LOOP, expect_unsupported, wait_for

T = TypeVar("T")

NODES = ["node1", "node2", "node3"]
SPARE = "spare1"
THEIRS = "bios update (alice)"
OURS = "recover: xid79 on gpu0"


class Side(Protocol):
    """One backend under test (``ctl``) and what a test arranges around it."""

    ctl: SlurmControl

    def hold(self, node: str, state: str, reason: str) -> None:
        """Someone else (an admin) sets ``node`` DOWN or DRAIN with ``reason``."""
        ...

    def start_job(self, node: str) -> str:
        """A requeueable job running on ``node`` (and only there); returns its id once it
        runs."""
        ...

    def settle(self, probe: Callable[[], T | None], what: str) -> T:
        """``probe()`` once it holds: the real cluster gets a few seconds, the fake none."""
        ...

    def ended_job(self, node: str, *, aborted: bool = True, requeueable: bool = True) -> str:
        """A job on ``node`` that ended: ``aborted``, its training process died of SIGABRT
        while its batch shell lived on (the shell passed 134 on: FAILED); else it exited 0
        (COMPLETED). Returns its id once it ended."""
        ...


class FakeSide:
    def __init__(self) -> None:
        self.fake = FakeSlurm(NODES, [SPARE])
        self.ctl: SlurmControl = self.fake

    def hold(self, node: str, state: str, reason: str) -> None:
        self.fake.scontrol_update([node], state, reason)

    def start_job(self, node: str) -> str:
        return self.fake.run_job([node], name="contract")

    def settle(self, probe: Callable[[], T | None], what: str) -> T:
        got = probe()
        assert got, f"the fake should hold at once: {what} (got {got!r})"
        return got

    def ended_job(self, node: str, *, aborted: bool = True, requeueable: bool = True) -> str:
        job = self.fake.run_job([node], name="contract", requeueable=requeueable)
        if aborted:
            self.fake.fail_job(job, 134)
        else:
            self.fake.finish_job(job)
        return job


class RealSide:
    def __init__(self, ctl: SlurmControl, admin: CliSlurm, job_dir: Path) -> None:
        self.ctl = ctl
        self.admin = admin
        self.job_dir = job_dir

    def hold(self, node: str, state: str, reason: str) -> None:
        self.admin.run(
            ["scontrol", "update", f"NodeName={node}", f"State={state}", f"Reason={reason}"]
        )

    def start_job(self, node: str) -> str:
        job_id = self.admin.submit(
            BatchJob(
                script=LOOP,
                options={
                    "requeue": None,
                    "job-name": "contract",
                    "nodelist": node,
                    "output": str(self.job_dir / "slurm-%j.out"),
                    "export": f"ALL,OUT={self.job_dir / 'out'}",
                },
                workdir=str(self.job_dir),
            )
        )
        wait_for(lambda: self.admin.job(job_id).state == "RUNNING", 15, f"job on {node}")
        return job_id

    def settle(self, probe: Callable[[], T | None], what: str) -> T:
        return wait_for(probe, 15, what)

    def ended_job(self, node: str, *, aborted: bool = True, requeueable: bool = True) -> str:
        job_id = self.admin.submit(
            BatchJob(
                script=ABORTED if aborted else "#!/bin/bash\nexit 0\n",
                options={
                    "requeue" if requeueable else "no-requeue": None,
                    "job-name": "contract",
                    "nodelist": node,
                    "output": str(self.job_dir / "slurm-%j.out"),
                },
                workdir=str(self.job_dir),
            )
        )
        wait_for(lambda: self.admin.job(job_id).finished, 15, f"job {job_id} ended")
        return job_id


#: A batch shell whose "training" child dies of SIGABRT; the shell passes 134 on.
ABORTED = """#!/bin/bash
sleep 60 &
child=$!
kill -ABRT "$child"
wait "$child"
exit $?
"""


# The real backends are ``slow``: the quick tier holds the fake to the cases, the whole tier
# the real daemons.
@pytest.fixture(
    params=[
        "fake",
        *(pytest.param(b, marks=[pytest.mark.slurm, pytest.mark.slow]) for b in BACKENDS),
    ]
)
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    """The backend under test: the fake, or a real one on a session cluster (22.05, or the
    25.11 build for ``NAME@25.11``)."""
    if request.param == "fake":
        yield FakeSide()
        return
    admin: CliSlurm = request.getfixturevalue("slurm_ctl")
    job_dir: Path = request.getfixturevalue("job_dir")
    ctl = backend_for(request, split_backend(request.param)[0], admin)
    expect_unsupported(request, ctl)
    yield RealSide(ctl, admin, job_dir)
    if isinstance(ctl, RestSlurm):
        ctl.close()


def in_service(side: Side, node: str) -> bool:
    return side.ctl.node(node).in_service


# --- reading --------------------------------------------------------------------------------


def test_nodes_are_sorted_and_the_spare_is_ours(side: Side) -> None:
    nodes = side.ctl.nodes()
    assert [n.name for n in nodes] == [*NODES, SPARE]
    assert all(n.in_service for n in nodes if n.name in NODES)
    spare = side.ctl.node(SPARE)
    assert (spare.state, spare.flags, spare.reason) == ("IDLE", frozenset({"DRAIN"}), SPARE_REASON)
    assert spare.reason_is_ours
    assert not spare.held_by_other


def test_unknown_and_invalid_node_names_are_usage_errors(side: Side) -> None:
    known = r"Unknown node 'node9'\. Known: node1, node2, node3, spare1"
    for call in (
        lambda: side.ctl.node("node9"),
        lambda: side.ctl.down("node9", "x"),
        lambda: side.ctl.drain("node9", "x"),
        lambda: side.ctl.resume("node9"),
        lambda: side.ctl.jobs_on("node9"),
        lambda: side.ctl.down_many(["node1", "node9"], "x"),
        lambda: side.ctl.drain_many(["node9"], "x"),
    ):
        with pytest.raises(UsageError, match=known):
            call()
    with pytest.raises(UsageError, match="Invalid node name"):
        side.ctl.drain("node1,node2", "x")
    with pytest.raises(UsageError, match="Invalid reason"):
        side.ctl.down("node1", 'say "hi"')
    assert all(in_service(side, n) for n in NODES)  # nothing was changed on the way


# --- our own marks --------------------------------------------------------------------------


@pytest.mark.writes("drain", "resume")
def test_our_drain_is_marked_idempotent_and_undone_by_resume(side: Side) -> None:
    assert side.ctl.drain("node1", "xid79 on gpu0") is True
    node = side.ctl.node("node1")
    assert (node.drained, node.down, node.reason) == (True, False, OURS)
    assert node.reason_set_by  # Slurm says who wrote it
    assert not node.held_by_other
    assert side.ctl.drain("node1", "xid79 on gpu0") is False  # holds: a no-op
    assert side.ctl.drain("node1", OURS) is False  # the prefix is not doubled
    assert side.ctl.drain("node1", "xid48 ECC") is True  # ours, another reason: rewritten
    assert side.ctl.node("node1").reason == "recover: xid48 ECC"
    assert side.ctl.resume("node1") is True
    side.settle(lambda: in_service(side, "node1"), "node1 back in service")
    assert side.ctl.node("node1").reason == ""
    assert side.ctl.resume("node1") is False  # in service: a no-op


@pytest.mark.writes("down", "drain", "resume")
def test_our_down_is_marked_idempotent_and_a_drain_adds_to_it(side: Side) -> None:
    assert side.ctl.down("node2", "xid79 on gpu0") is True
    node = side.ctl.node("node2")
    assert (node.down, node.drained, node.reason) == (True, False, OURS)
    assert side.ctl.down("node2", "xid79 on gpu0") is False
    assert side.ctl.down("node2", OURS) is False
    # Our DOWN, then our drain (a spare being returned): DOWN+DRAIN, once.
    assert side.ctl.drain("node2", "xid79 on gpu0") is True
    node = side.ctl.node("node2")
    assert (node.down, node.drained, node.reason) == (True, True, OURS)
    assert side.ctl.drain("node2", "xid79 on gpu0") is False
    assert side.ctl.down("node2", "xid79 on gpu0") is False
    assert side.ctl.resume("node2") is True
    side.settle(lambda: in_service(side, "node2"), "node2 back in service")
    assert side.ctl.resume("node2") is False


@pytest.mark.writes("down_many", "drain_many")
def test_many_at_once_changes_only_the_nodes_that_need_it(side: Side) -> None:
    assert side.ctl.drain_many(["node1", "node2"], "xid79 on gpu0") == ["node1", "node2"]
    assert side.ctl.drain_many(["node2", "node1", "node1"], "xid79 on gpu0") == []
    assert side.ctl.down_many(["node2", "node3", "node3"], "xid79 on gpu0") == [
        "node2",
        "node3",
    ]
    assert side.ctl.down_many(["node2", "node3"], "xid79 on gpu0") == []
    states = {n.name: (n.down, n.drained, n.reason) for n in side.ctl.nodes()}
    assert states == {
        "node1": (False, True, OURS),
        "node2": (True, True, OURS),
        "node3": (True, False, OURS),
        SPARE: (False, True, SPARE_REASON),
    }


# --- someone else's marks -------------------------------------------------------------------


@pytest.mark.writes("down", "resume")
def test_down_of_a_node_someone_else_drained_goes_down_with_their_reason(side: Side) -> None:
    # The case the fake once got wrong: it refused, the real adapter sets the node DOWN.
    side.hold("node3", "DRAIN", THEIRS)
    assert side.ctl.node("node3").held_by_other
    assert side.ctl.drain("node3", "xid79 on gpu0") is False  # their drain: kept, a no-op
    assert side.ctl.down("node3", "xid79 on gpu0") is True
    node = side.ctl.node("node3")
    assert (node.down, node.drained, node.reason) == (True, True, THEIRS)
    assert node.held_by_other  # still theirs: our resume never puts it back
    assert side.ctl.down("node3", "xid79 on gpu0") is False
    assert side.ctl.drain("node3", "xid79 on gpu0") is False
    with pytest.raises(ReasonNotOursError, match=r"'bios update \(alice\)'"):
        side.ctl.resume("node3")
    assert side.ctl.node("node3").down
    assert side.ctl.resume("node3", force=True) is True
    side.settle(lambda: in_service(side, "node3"), "node3 back in service")


@pytest.mark.writes("down_many")
def test_down_many_writes_their_reason_on_theirs_and_ours_on_the_rest(side: Side) -> None:
    side.hold("node1", "DRAIN", THEIRS)
    assert side.ctl.down_many(NODES, "xid79 on gpu0") == NODES
    states = {n.name: (n.down, n.reason) for n in side.ctl.nodes() if n.name in NODES}
    assert states == {"node1": (True, THEIRS), "node2": (True, OURS), "node3": (True, OURS)}
    assert side.ctl.down_many(NODES, "xid79 on gpu0") == []


def test_someone_elses_down_is_kept_and_never_undone(side: Side) -> None:
    side.hold("node2", "DOWN", THEIRS)
    assert side.ctl.down("node2", "xid79 on gpu0") is False
    assert side.ctl.drain("node2", "xid79 on gpu0") is False
    assert side.ctl.down_many(["node2"], "xid79 on gpu0") == []
    with pytest.raises(ReasonNotOursError) as refused:
        side.ctl.resume("node2")
    assert (refused.value.node, refused.value.reason) == ("node2", THEIRS)
    node = side.ctl.node("node2")
    assert (node.down, node.drained, node.reason) == (True, False, THEIRS)


def test_resume_of_a_node_someone_else_drained_is_refused(side: Side) -> None:
    side.hold("node1", "DRAIN", THEIRS)
    with pytest.raises(ReasonNotOursError, match="not ours"):
        side.ctl.resume("node1")
    node = side.ctl.node("node1")
    assert (node.drained, node.reason) == (True, THEIRS)
    assert side.ctl.resume("node2") is False  # in service: nothing to resume


# --- jobs -----------------------------------------------------------------------------------


def test_jobs_on_lists_the_jobs_using_the_node(side: Side) -> None:
    job = side.start_job("node1")
    assert [j.job_id for j in side.ctl.jobs_on("node1")] == [job]
    assert side.ctl.jobs_on("node2") == []
    assert side.ctl.job(job).state == "RUNNING"
    assert side.ctl.job(job).nodes == ("node1",)
    assert job in [j.job_id for j in side.ctl.jobs()]
    with pytest.raises(UsageError, match="Invalid job id"):
        side.ctl.job("1; scancel -u root")


@pytest.mark.writes("drain")
def test_drain_lets_the_jobs_on_the_node_run(side: Side) -> None:
    job = side.start_job("node1")
    assert side.ctl.drain("node1", "xid95 save first") is True
    assert side.ctl.job(job).state == "RUNNING"
    assert [j.job_id for j in side.ctl.jobs_on("node1")] == [job]
    node = side.ctl.node("node1")
    assert node.drained
    assert not node.down
    assert not node.in_service


@pytest.mark.writes("down")
def test_down_requeues_the_jobs_on_the_node(side: Side) -> None:
    job = side.start_job("node1")
    assert side.ctl.down("node1", "xid79 on gpu0") is True
    # Slurm requeues a --requeue job on a node set DOWN; pinned to node1, it then waits.
    side.settle(lambda: side.ctl.job(job).state == "PENDING", "job requeued, pending")
    assert side.ctl.job(job).restart_count == 1
    assert side.ctl.jobs_on("node1") == []


@pytest.mark.writes("requeue")
def test_requeue_is_idempotent(side: Side) -> None:
    job = side.start_job("node2")
    assert side.ctl.requeue(job) is True
    assert side.ctl.requeue(job) is False  # being requeued or pending already: a no-op
    side.settle(lambda: side.ctl.job(job).state == "PENDING", "job pending")
    assert side.ctl.job(job).restart_count == 1
    assert side.ctl.requeue(job) is False
    with pytest.raises(UsageError, match="Unknown job 999999"):
        side.ctl.requeue("999999")


def test_an_ended_job_reads_with_its_status_end_and_nodes(side: Side) -> None:
    job = side.ended_job("node2")
    info = side.ctl.job(job)
    assert (info.state, info.exit_code, info.signal) == ("FAILED", 134, None)
    assert (info.nodes, info.restart_count, info.requeueable) == (("node2",), 0, True)
    assert info.end_time > 0
    assert info.finished
    assert side.ctl.jobs_on("node2") == []  # it let go of the node


@pytest.mark.writes("requeue")
def test_requeue_ended_requeues_one_run_once(side: Side) -> None:
    job = side.ended_job("node1")
    assert side.ctl.requeue_ended(job, 1) is False  # not the run that ended
    assert side.ctl.job(job).state == "FAILED"
    assert side.ctl.requeue_ended(job, 0) is True
    info = side.ctl.job(job)
    assert (info.state, info.restart_count) == ("PENDING", 1)
    assert side.ctl.requeue_ended(job, 0) is False  # its count rose: requeued already
    assert side.ctl.job(job).restart_count == 1
    with pytest.raises(UsageError, match="Unknown job 999999"):
        side.ctl.requeue_ended("999999", 0)


def test_requeue_ended_of_a_live_job_is_a_no_op(side: Side) -> None:
    job = side.start_job("node3")
    assert side.ctl.requeue_ended(job, 0) is False
    info = side.ctl.job(job)
    assert (info.state, info.restart_count) == ("RUNNING", 0)


@pytest.mark.writes("requeue")
def test_requeue_ended_of_a_no_requeue_job_is_refused(side: Side) -> None:
    # A completed job, so that no later test's coordinator takes it for a fault's victim
    # (slurmctld keeps it for MinJobAge, and a --no-requeue job cannot be tidied away).
    job = side.ended_job("node1", aborted=False, requeueable=False)
    info = side.ctl.job(job)
    assert (info.state, info.exit_code, info.requeueable) == ("COMPLETED", 0, False)
    with pytest.raises(SlurmRefusedError, match="disabled"):
        side.ctl.requeue_ended(job, 0)
    assert side.ctl.job(job).state == "COMPLETED"


def test_cancel_is_idempotent(side: Side) -> None:
    job = side.start_job("node3")
    assert side.ctl.cancel(job) is True
    side.settle(lambda: side.ctl.job(job).finished, "job cancelled")
    assert side.ctl.job(job).state == "CANCELLED"
    assert side.ctl.cancel(job) is False
    assert side.ctl.cancel("999999") is False  # never existed: nothing to cancel
    assert side.ctl.jobs_on("node3") == []
