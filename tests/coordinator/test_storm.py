"""A storm on real daemons, small: 32 real slurmd (+2 spares) each running a job, the real
coordinator, 20 nodes failing at once (2 through real agents reading a kernel line, 18 POSTed
with their own tokens). Every faulted node must go DOWN with our reason in a bounded number of
``scontrol update`` calls, and no healthy node may change. It runs the rig
``benchmarks.storm_bench`` measures with (:mod:`benchmarks.storm_rig`), so the benchmark keeps
working; nothing here is timed.

The readings the rig relies on (slurmctld's log, the shim's log, the coordinator's incidents,
the check of healthy nodes) are tested first on literal input.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.storm_read import (
    downs_in,
    healthy_changes,
    incident_latencies,
    nodes_of_update,
    promotions,
    stages,
    summary,
    update_calls,
    updated_in,
)
from benchmarks.storm_rig import FAULT, Rig, StormOptions
from recovery.errors import UsageError
from recovery.ports.slurm import JobInfo, NodeInfo, is_ours
from tests.slurm.helpers import require_local_slurm

# What slurmctld 22.05.8 logged for `scontrol update NodeName=node1,node2 State=DOWN` with a
# job on node1 (captured on the local cluster).
REASON = "recover: xid79 GPU has fallen off the bus"
LOG = f"""\
[2026-12-02T12:45:21.577] SchedulerParameters=default_queue_depth=100,max_rpc_cnt=0
[2026-12-02T12:45:21.583] update_node: node node1 reason set to: {REASON}
[2026-12-02T12:45:21.583] requeue job JobId=1 due to failure of node node1
[2026-12-02T12:45:21.584] Requeuing JobId=1
[2026-12-02T12:45:21.584] update_node: node node1 state set to DOWN
[2026-12-02T12:45:21.584] update_node: node node2 reason set to: {REASON}
[2026-12-02T12:45:21.584] update_node: node node2 state set to DOWN
[2026-12-02T12:45:21.603] _job_complete: JobId=1 WTERMSIG 15
"""


def test_downs_are_read_from_slurmctlds_log_with_its_milliseconds() -> None:
    downs = downs_in(LOG)
    assert sorted(downs) == ["node1", "node2"]
    assert downs["node1"] == downs["node2"]  # both stamped .584
    assert downs_in(LOG.replace(".584] update_node: node node2", ".600] update_node: node node2"))[
        "node2"
    ] == pytest.approx(downs["node1"] + 0.016)
    assert updated_in(LOG) == {"node1", "node2"}
    assert downs_in("[2026-12-02T12:45:21.577] Requeuing JobId=1\n") == {}


def test_the_shims_log_gives_each_update_its_start_and_nodes(tmp_path: Path) -> None:
    log = tmp_path / "scontrol.log"
    log.write_text(
        "1796215521.500000000 show node --json\n"
        f"1796215521.600000000 update NodeName=node1,node2 State=DOWN Reason={REASON}\n"
        "1796215522.100000000 update NodeName=spare1 State=RESUME\n"
    )
    calls = update_calls(log)
    assert [at for at, _ in calls] == [1796215521.6, 1796215522.1]
    assert nodes_of_update(calls[0][1]) == ["node1", "node2"]
    assert nodes_of_update(calls[1][1]) == ["spare1"]
    assert update_calls(tmp_path / "absent.log") == []


def _node(name: str, state: str = "ALLOCATED", reason: str = "", *flags: str) -> NodeInfo:
    return NodeInfo(name=name, state=state, flags=frozenset(flags), reason=reason)


def _job(job_id: str, node: str) -> JobInfo:
    return JobInfo(job_id=job_id, name="storm", state="RUNNING", nodes=(node,))


def test_a_healthy_node_that_changed_in_any_way_is_named() -> None:
    before = {n: _node(n) for n in ("node1", "node2", "node3", "node4")}
    before["spare1"] = _node("spare1", "IDLE", "recover: spare", "DRAIN")
    after = dict(before)
    after["node1"] = _node("node1", "DOWN", REASON)
    after["spare1"] = _node("spare1")  # promoted: spares may change
    jobs = {n: [_job(str(k), n)] for k, n in enumerate(before)}
    check = functools.partial(healthy_changes, faulted={"node1"}, fault=FAULT, spares={"spare1"})
    assert check(before, after, jobs, jobs, log_text="", calls=[]) == []

    after["node2"] = _node("node2", "ALLOCATED", "", "DRAIN")
    moved = {**jobs, "node3": [_job("99", "node3")]}
    calls = [(0.0, "update NodeName=node1,node4 State=DOWN Reason=x")]
    problems = check(before, after, jobs, moved, log_text="", calls=calls)
    assert len(problems) == 3
    assert problems[0].startswith("node2 (healthy) changed")
    assert problems[1].startswith("node3 (healthy): running jobs ['2'] -> ['99']")
    assert problems[2] == "node4 (healthy) was named in an update"
    logged = LOG.replace("node2", "node3")
    unchanged = dict(before, node1=after["node1"])
    assert check(before, unchanged, jobs, jobs, log_text=logged, calls=[]) == [
        "node3 (healthy) was named in an update"
    ]


@pytest.mark.parametrize(
    "now",
    [
        _node("node1"),  # never taken out
        _node("node1", "DOWN", "maintenance by admin"),  # someone else's reason
        _node("node1", "ALLOCATED", REASON, "DRAIN"),  # drained, not DOWN
        _node("node1", "DOWN", "recover: xid48 double-bit ECC"),  # our reason, another fault
    ],
)
def test_a_faulted_node_must_be_down_with_our_reason_for_the_fault(now: NodeInfo) -> None:
    before = {"node1": _node("node1")}
    problems = healthy_changes(
        before, {"node1": now}, {}, {}, faulted={"node1"}, fault=FAULT, log_text="", calls=[],
        spares=set(),
    )  # fmt: skip
    assert len(problems) == 1
    assert problems[0].startswith("node1 (faulted): not DOWN with our xid79 reason")


def _incident(node: str, **at: float) -> dict[str, object]:
    return {
        "node": node,
        "phases": [{"name": k.replace("_", "-"), "at": {"wall": v, "mono": v - 1000}}
                   for k, v in at.items()],
    }  # fmt: skip


def test_the_coordinators_stages_chain_from_the_fault_to_the_record() -> None:
    incidents = [
        _incident("node1", received=10.1, decided=10.3, node_down=11.0, spare_promoted=12.0),
        _incident("node2", received=10.2, decided=10.3),  # not recorded down yet
    ]
    taken, missing = incident_latencies(incidents, ["node1", "node2", "node3"])
    assert taken == [pytest.approx(0.9)]
    assert missing == ["node2", "node3"]
    assert promotions(incidents) == {"node1": 12.0}
    calls = [(10.5, "update NodeName=node1,node2 State=DOWN Reason=x")]
    got = stages(incidents, 10.0, calls, {"node1": 10.6, "node2": 10.7}, ["node1", "node2"])
    assert [v["count"] for v in got.values()] == [2, 2, 2, 2, 1]
    assert [v["max_s"] for v in got.values()] == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.4])


def test_summary_takes_the_nearest_rank_p99() -> None:
    s = summary(float(i) for i in range(1, 151))
    assert (s["count"], s["p50_s"], s["p99_s"], s["max_s"]) == (150, 75.5, 149.0, 150.0)
    assert summary([])["p50_s"] is None


@pytest.mark.parametrize(
    ("opts", "named"),
    [
        (StormOptions(nodes=8, faulted=9), "--faulted 9: expected 1 to 8"),
        (StormOptions(nodes=8, faulted=2, agents=3), "--agents 3: expected 0 to 2"),
        (StormOptions(backend="carrier-pigeon"), "Known: cli, "),
    ],
)
def test_options_that_cannot_run_say_what_is_valid(opts: StormOptions, named: str) -> None:
    with pytest.raises(UsageError, match=named):
        opts.check()


# --- on real daemons -------------------------------------------------------------------------

#: More than the take-down needs: the 20 nodes go out in one call when all events are decided
#: in one step, in a few when the engine was mid-step as they came; plus one RESUME per spare.
MAX_UPDATES = 10


@pytest.fixture
def root() -> Iterator[Path]:
    # Not pytest's tmp_path: under xdist it is too deep for slurmstepd's socket paths.
    path = Path(tempfile.mkdtemp(prefix="storm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_a_storm_of_20_takes_every_faulted_node_down_and_no_healthy_one(root: Path) -> None:
    require_local_slurm()
    opts = StormOptions(nodes=32, spares=2, faulted=20, agents=2, deadline_s=90)
    with Rig(opts, root) as rig:
        rig.start()
        result = rig.storm()
        nodes = {n.name: n for n in rig.ctl.nodes()}
    assert rig.leftovers == [], "processes left running after the rig stopped"
    assert result.not_down == []
    assert result.problems == []
    assert len(result.faulted) == 20
    assert len(result.via_agent) == 2
    for name in result.faulted:
        assert nodes[name].down
        assert is_ours(nodes[name].reason)
        assert FAULT in nodes[name].reason
    healthy = [n for n in nodes.values() if n.name.startswith("node")]
    healthy = [n for n in healthy if n.name not in result.faulted]
    assert len(healthy) == 12
    assert all(n.state == "ALLOCATED" and not n.reason for n in healthy)
    assert result.updates is not None
    downs = [c for c in result.updates if "state=down" in c.lower()]
    assert downs, result.updates
    assert len(result.updates) <= MAX_UPDATES, result.updates
    assert sorted(n for c in downs for n in nodes_of_update(c)) == result.faulted
    # Every event reached the coordinator and was recorded, through the agents too.
    assert result.fault_to_down["count"] == 20
    assert result.receipt_to_takedown["count"] == 20
    assert result.post_answered["count"] == 18
