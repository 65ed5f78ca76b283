"""The coordinator's Kubernetes steps on a FakeSlurm and a FakeNodes (fakes of our own ports):
which step is due when, the order (Slurm first, the slurmd pod only once Slurm released the
node), retries, refusals, restarts, the way back, and Slinky's switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from recover.render import render_status
from recovery.coordinator.kube import KubeMode, released, unready_event
from recovery.model import Source
from recovery.ports.journal import ActionStatus, IncidentStatus
from recovery.ports.nodes import KubeNode
from recovery.ports.owners import SUNK_LOCK_TAINT
from recovery.ports.slurm import NodeInfo
from tests.fakes.nodes import FakeNodes
from tests.fakes.slurm import FakeSlurm
from tests.helpers import Crash

from .helpers import Rig, event

NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    slurm = FakeSlurm(NODES, ["s1"])
    return Rig(tmp_path / "journal.sqlite", slurm, nodes=FakeNodes([*NODES, "s1"]))


def _nodes(rig: Rig) -> FakeNodes:
    assert rig.nodes is not None
    return rig.nodes


def tick(rig: Rig) -> None:
    """The next reconcile tick, half a second on (Slurm is looked at again)."""
    rig.clock.advance(0.5)
    rig.engine.step()


@pytest.mark.parametrize(
    ("state", "flags", "out"),
    [
        ("DOWN", set(), True),
        ("IDLE", {"DRAIN"}, True),
        ("DOWN", {"DRAIN"}, True),
        ("ALLOCATED", {"DRAIN"}, False),  # DRAINING: a job still runs there
        ("MIXED", {"DRAIN"}, False),
        ("IDLE", {"DRAIN", "COMPLETING"}, False),
        ("IDLE", set(), False),
    ],
)
def test_released_means_down_or_drained(state: str, flags: set[str], out: bool) -> None:
    assert released(NodeInfo("n1", state, frozenset(flags))) is out
    assert released(None) is False


def test_xid79_marks_deletes_the_pod_and_promotes_in_kubernetes_too(rig: Rig) -> None:
    job = rig.slurm.run_job(NODES)
    rig.send(event("n2", "xid79"))
    # Slurm's calls are exactly those of a Slurm-only cluster.
    assert rig.slurm.updates() == [
        ("down", "n2", "recover: xid79 GPU has fallen off the bus"),
        ("resume", "s1"),
    ]
    inc = rig.incident("n2")
    # The look at Slurm this step was taken before the take-down: the pod waits a tick.
    assert _nodes(rig).calls == [("mark", "n2", "xid79", inc.id), ("promote", "s1")]
    tick(rig)
    assert _nodes(rig).calls[-1] == ("delete-pods", "n2")
    n2 = _nodes(rig).node("n2")
    assert n2.marked
    assert n2.condition is not None
    assert (n2.condition.reason, n2.condition.message) == ("Xid79", inc.id)
    rig.slurm.start_job(job, ["n1", "n3", "n4", "s1"])
    tick(rig)
    assert rig.phases("n2") == [
        "fault", "received", "decided", "node-down", "spare-promoted",
        "k8s-marked", "k8s-spare-promoted", "slurmd-pod-deleted", "jobs-requeued",
        "job-running", "closed",
    ]  # fmt: skip
    detail = {p.name.value: p.detail for p in rig.incident("n2").phases}
    assert detail["slurmd-pod-deleted"] == "slurmd-n2"
    tick(rig)
    assert len(_nodes(rig).calls) == 3  # nothing repeated once done


def test_the_pod_waits_while_the_node_drains(rig: Rig) -> None:
    job = rig.slurm.run_job(["n1", "n2"])
    rig.send(event("n1", "xid95"))  # drain-reset: the job saves first
    assert ("mark", "n1", "xid95", rig.incident("n1").id) in _nodes(rig).calls
    tick(rig)
    tick(rig)
    assert ("delete-pods", "n1") not in _nodes(rig).calls  # ALLOCATED+DRAIN: draining
    assert "slurmd-pod-deleted" not in rig.phases("n1")
    # Training saved and left; Slurm has nothing running there any more: DRAINED.
    rig.slurm.requeue(job)
    rig.slurm.set_node("n1", state="IDLE")
    tick(rig)
    assert ("delete-pods", "n1") in _nodes(rig).calls
    phases = rig.phases("n1")
    assert phases.index("jobs-saved") < phases.index("slurmd-pod-deleted")


def test_a_node_back_in_service_keeps_its_pod(rig: Rig) -> None:
    rig.slurm.run_job(["n1"])
    rig.send(event("n1", "xid95"))
    rig.slurm.set_node("n1", state="IDLE", flags=frozenset(), reason="")  # an admin resumed it
    tick(rig)
    assert ("delete-pods", "n1") not in _nodes(rig).calls
    assert "slurmd-pod-kept" in rig.phases("n1")


def test_an_api_server_outage_is_retried_and_holds_the_incident_open(rig: Rig) -> None:
    _nodes(rig).unavailable = 2  # the step's read of every node, then the marking
    rig.send(event("n3", "xid79"))
    assert "k8s-marked" not in rig.phases("n3")
    assert rig.incident("n3").status is IncidentStatus.open
    tick(rig)
    assert "k8s-marked" in rig.phases("n3")
    tick(rig)  # the pod goes once Slurm was seen to hold the node DOWN
    assert "slurmd-pod-deleted" in rig.phases("n3")
    assert rig.incident("n3").status is IncidentStatus.closed  # no job ran there


def test_a_node_kubernetes_does_not_know_is_skipped(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]), nodes=FakeNodes(["n1"]))
    rig.send(event("n2", "xid79"))
    phases = rig.phases("n2")
    assert "k8s-skipped" in phases
    assert "k8s-marked" not in phases
    assert rig.incident("n2").status is IncidentStatus.closed


def test_a_refusal_is_recorded_and_ends_the_kubernetes_steps(rig: Rig) -> None:
    _nodes(rig).forbidden = {"mark_unhealthy"}
    rig.send(event("n1", "xid79"))
    inc = rig.incident("n1")
    (failed,) = [p for p in inc.phases if p.name == "k8s-failed"]
    assert "forbidden (403)" in failed.detail
    assert inc.status is IncidentStatus.closed
    assert [a.status for a in inc.actions] == [ActionStatus.done, ActionStatus.done]


def test_killed_between_slurm_and_kubernetes_nothing_is_done_twice(rig: Rig) -> None:
    rig.slurm.crash_before = {"resume"}  # dies after the take-down, before the promotion
    with pytest.raises(Crash):
        rig.send(event("n2", "xid79"))
    assert _nodes(rig).calls == []
    rig.restart()
    tick(rig)
    tick(rig)
    tick(rig)
    inc = rig.incident("n2")
    assert _nodes(rig).calls == [
        ("mark", "n2", "xid79", inc.id),
        ("delete-pods", "n2"),
        ("promote", "s1"),
    ]
    assert rig.slurm.updates() == [
        ("down", "n2", "recover: xid79 GPU has fallen off the bus"),
        ("resume", "s1"),
    ]


def test_a_repaired_node_loses_our_marks_and_becomes_a_spare(rig: Rig) -> None:
    rig.send(event("n1", "xid79"))
    _nodes(rig).unavailable = 1  # the first try of the way back fails: retried
    rig.engine.repaired("n1")
    tick(rig)
    assert ("clear", "n1") in _nodes(rig).calls
    assert ("retire", "n1") in _nodes(rig).calls
    n1 = _nodes(rig).node("n1")
    assert not n1.marked
    assert n1.spare
    names = [p.name.value for p in rig.incident("n1").phases]
    assert names.index("returned-to-pool") < names.index("k8s-cleared")
    assert "k8s-spare-retired" in names
    retire = next(a for a in rig.incident("n1").actions if a.action.kind == "retire")
    assert retire.status is ActionStatus.done


def test_slinky_drains_through_the_operator(tmp_path: Path) -> None:
    slurm = FakeSlurm(NODES, ["s1"])
    nodes = FakeNodes([*NODES, "s1"])
    rig = Rig(tmp_path / "j.sqlite", slurm, nodes=nodes, kube=KubeMode(via_operator=True))
    job = slurm.run_job(["n2"])
    rig.send(event("n2", "xid79"))
    inc = rig.incident("n2")
    assert nodes.calls[0] == ("pod-cordon", "n2", inc.id)
    assert not [c for c in slurm.updates() if c[0] in ("down", "drain")]  # not Slurm directly
    down = inc.actions[0]
    assert down.status is ActionStatus.waiting
    # The slurm-operator drains the Slurm node with its own reason.
    slurm.set_node("n2", flags=frozenset({"DRAIN"}), reason="slurm-operator: pod-cordon")
    tick(rig)
    tick(rig)
    inc = rig.incident("n2")
    assert inc.actions[0].status is ActionStatus.done
    assert ("requeue", job) in slurm.updates()  # a take-down's jobs cannot stay
    assert "node-drained" in rig.phases("n2")
    assert ("mark", "n2", "xid79", inc.id) in nodes.calls
    assert ("delete-pods", "n2") not in nodes.calls  # the operator owns its pods
    rows = {r["name"]: r for r in rig.engine.nodes()}
    assert rows["n2"]["held_by"] == "slinky"


def test_status_shows_who_else_holds_a_kubernetes_node(rig: Rig) -> None:
    nodes = _nodes(rig)
    # SUNK locks n4 (its taint; the fake reads it as the real adapter does).
    nodes.patch_node("n4", {"spec": {"taints": [{"key": SUNK_LOCK_TAINT, "effect": "NoSchedule"}]}})
    rig.engine.step()
    doc = rig.engine.status()
    (row,) = [r for r in doc["nodes"] if r["name"] == "n4"]
    assert row["k8s"]["held_by"] == ["sunk"]
    assert row["k8s"]["others"] == ["taint sunk.coreweave.com/lock"]
    line = next(ln for ln in render_status(doc).splitlines() if ln.startswith("n4 "))
    assert "sunk (k8s)" in line


def test_without_kubernetes_rows_have_no_k8s_part(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(NODES, ["s1"]))
    rig.engine.step()
    assert all(r["k8s"] is None for r in rig.engine.nodes())


def test_unready_events() -> None:
    lost = unready_event(KubeNode("n1", ready="Unknown", ready_since=1_800_000_000.0,
                                  ready_reason="NodeStatusUnknown"), 1_800_000_100.0)  # fmt: skip
    assert lost is not None
    assert (lost.id, lost.fault, lost.source) == (
        "k8s-n1-ready-unknown-1800000000", "node-unreachable", Source.k8s,
    )  # fmt: skip
    assert lost.observed_at == 1_800_000_000.0
    assert unready_event(KubeNode("n1", ready="True"), 0.0) is None
    assert unready_event(KubeNode("n1"), 0.0) is None  # no kubelet ever reported
    assert unready_event(KubeNode("9-not-a-slurm-name", ready="False"), 1.0) is None
