"""The coordinator in Kubernetes mode (its own process, as `recover coordinator serve
--kubeconfig` runs it, with the coordinator ServiceAccount's token under rbac.yaml) against
the session's real Slurm cluster and the real local API server, whose Nodes and slurmd pods are
named after the Slurm nodes.

The training job asks for every in-service node (3 of 3): after a node is lost it runs again
only once the spare is promoted, so the replacement is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recovery import proc
from recovery.ports.nodes import CONDITION_TYPE, PROMOTED_LABEL, TAINT_KEY
from recovery.ports.owners import SLINKY_POD_CORDON
from recovery.ports.slurm import BatchJob, JobInfo
from service.daemons import coordinator as coordinator_proc
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.coordinator.helpers import Coordinator, events
from tests.helpers import submit_train
from tests.k8s.helpers import condition, gone_or_terminating, node_json, pod_json, taints
from tests.plugins.kube_api import KubeApi, KubeNodes
from tests.slurm.helpers import down_node, running, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.slurm]

RBAC = Path(__file__).resolve().parents[2] / "k8s" / "deploy" / "rbac.yaml"
TRAIN = ["--steps", "24", "--save-every", "4", "--model", "mlp-tiny", "--step-sleep", "0.25"]


def _start(
    local_cluster: LocalCluster, kube_api: KubeApi, layout: KubeNodes, tmp_path: Path,
    *extra: str,
) -> Iterator[Coordinator]:  # fmt: skip
    token = kube_api.service_account_token("recover", "recover-coordinator")
    kube_api.kubectl("apply", "-f", str(RBAC))
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "coordinator.kubeconfig", token)
    c = Coordinator(tmp_path / "coordinator", local_cluster.conf_path, {}, tmp_path / "none")
    args = ["--kubeconfig", str(kubeconfig), "--k8s-namespace", layout.namespace,
            "--k8s-pod-selector", layout.selector, "--tick", "0.3", *extra]  # fmt: skip
    c.endpoint = coordinator_proc.start(c.state_dir, slurm_conf=c.conf, extra_args=args)
    try:
        yield c
    finally:
        coordinator_proc.stop(c.state_dir)
        assert not proc.alive(c.endpoint.pid), "coordinator left running"


@pytest.fixture
def kube_coordinator(
    local_cluster: LocalCluster, slurm_ctl: CliSlurm, kube_api: KubeApi,
    kube_slurm_nodes: KubeNodes, tmp_path: Path,
) -> Iterator[Coordinator]:  # fmt: skip
    """A fresh coordinator in Kubernetes mode on the reset Slurm cluster and API server."""
    yield from _start(local_cluster, kube_api, kube_slurm_nodes, tmp_path)


def _completed(ctl: CliSlurm, job_id: str) -> JobInfo | None:
    job = ctl.job(job_id)
    return job if job.state == "COMPLETED" else None


def _closed(c: Coordinator, node: str) -> dict[str, Any] | None:
    inc = c.incident_on(node)
    return inc if inc is not None and inc["status"] == "closed" else None


def _at(inc: dict[str, Any], name: str) -> float:
    (p,) = [p for p in inc["phases"] if p["name"] == name]
    return float(p["at"]["mono"])


def _marked(kube: KubeApi, node: str) -> dict[str, Any] | None:
    obj = node_json(kube, node)
    cond = condition(obj, CONDITION_TYPE)
    ours = [t for t in taints(obj) if t["key"] == TAINT_KEY]
    return obj if obj["spec"].get("unschedulable") and ours and cond else None


@pytest.mark.slow
def test_xid79_takes_the_node_out_in_slurm_and_kubernetes_and_the_spare_in_both(
    kube_coordinator: Coordinator, slurm_ctl: CliSlurm, kube_api: KubeApi,
    kube_slurm_nodes: KubeNodes, job_dir: Path,
) -> None:  # fmt: skip
    c = kube_coordinator
    job_id, _ = submit_train(slurm_ctl, job_dir, "run", TRAIN, nodes=3)
    node = wait_for(lambda: running(slurm_ctl, job_id), 60, "the job running").nodes[0]
    run = job_dir / "run"
    wait_for(lambda: any(e["event"] == "checkpoint" and e["step"] >= 4 for e in events(run)),
             120, "a checkpoint at step 4")  # fmt: skip
    c.send(node, "xid79")

    down = wait_for(lambda: down_node(slurm_ctl, node), 20, f"{node} DOWN")
    assert down.reason == "recover: xid79 GPU has fallen off the bus"
    obj = wait_for(lambda: _marked(kube_api, node), 20, f"{node} marked in Kubernetes")
    (ours,) = [t for t in taints(obj) if t["key"] == TAINT_KEY]
    assert (ours["value"], ours["effect"]) == ("xid79", "NoSchedule")
    cond = condition(obj, CONDITION_TYPE)
    assert cond is not None
    inc = c.incident_on(node)
    assert inc is not None
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Xid79", inc["id"])
    pod = kube_slurm_nodes.pods[node]
    wait_for(lambda: gone_or_terminating(kube_api, kube_slurm_nodes.namespace, pod), 20,
             f"{pod} deleted")  # fmt: skip
    for other, name in kube_slurm_nodes.pods.items():
        if other != node:
            left = pod_json(kube_api, kube_slurm_nodes.namespace, name)
            assert left is not None
            assert not left["metadata"].get("deletionTimestamp")
    wait_for(lambda: slurm_ctl.node("spare1").in_service, 30, "spare1 in service in Slurm")
    wait_for(lambda: node_json(kube_api, "spare1")["metadata"]["labels"].get(PROMOTED_LABEL),
             20, "spare1 promoted in Kubernetes")  # fmt: skip

    done = wait_for(lambda: _completed(slurm_ctl, job_id), 180, "the job completed", 1.0)
    assert done.restart_count == 1
    assert "spare1" in done.nodes
    assert node not in done.nodes
    (restored,) = [e for e in events(run) if e["event"] == "restored"]
    assert restored["checkpoint_step"] >= 4
    inc = wait_for(lambda: _closed(c, node), 30, "the incident closed")
    names = {p["name"] for p in inc["phases"]}
    assert names == {
        "fault", "received", "decided", "node-down", "spare-promoted", "k8s-marked",
        "k8s-spare-promoted", "slurmd-pod-deleted", "jobs-requeued", "job-running", "closed",
    }  # fmt: skip
    # Slurm first, then Kubernetes; the pod only after Slurm was seen holding the node DOWN.
    assert _at(inc, "node-down") <= _at(inc, "k8s-marked") < _at(inc, "slurmd-pod-deleted")
    assert _at(inc, "spare-promoted") <= _at(inc, "k8s-spare-promoted")
    status = json.loads(c.cli("status", "--json").stdout)
    (row,) = [r for r in status["nodes"] if r["name"] == node]
    assert row["held_by"] == "recover"
    assert row["k8s"]["marked"] is True
    assert row["k8s"]["held_by"] == []


@pytest.mark.slow
def test_a_node_kubernetes_reports_notready_is_taken_out(
    kube_coordinator: Coordinator, slurm_ctl: CliSlurm, kube_api: KubeApi,
    kube_slurm_nodes: KubeNodes,
) -> None:  # fmt: skip
    c = kube_coordinator
    kube_api.set_node_ready("node3", "False", reason="KubeletNotReady")
    down = wait_for(lambda: down_node(slurm_ctl, "node3"), 30, "node3 DOWN")
    assert down.reason == "recover: node-unreachable Node stopped answering Slurm"
    inc = wait_for(lambda: c.incident_on("node3"), 10, "the incident")
    (stored,) = c.client.get(f"/v1/incidents/{inc['id']}")["events"]
    assert stored["event"]["source"] == "k8s"
    assert stored["event"]["id"].startswith("k8s-node3-ready-false-")
    wait_for(lambda: _marked(kube_api, "node3"), 20, "node3 marked in Kubernetes")
    wait_for(lambda: slurm_ctl.node("spare1").in_service, 30, "spare1 in service")
    # Repaired: back into the pool in Slurm, our marks off in Kubernetes, labelled a spare.
    kube_api.set_node_ready("node3", "True")
    done = c.cli("node", "repaired", "node3")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: slurm_ctl.node("node3").reason == "recover: spare", 30, "node3 a spare")

    def cleared() -> dict[str, Any] | None:
        obj = node_json(kube_api, "node3")
        return None if obj["spec"].get("unschedulable") else obj

    obj = wait_for(cleared, 20, "node3's marks cleared")
    assert not [t for t in taints(obj) if t["key"] == TAINT_KEY]
    assert condition(obj, CONDITION_TYPE) is None
    assert obj["metadata"]["labels"].get("recover.io/spare") == "true"


STUBBORN = """#!/bin/bash
# A job that keeps its node busy: it ignores the USR1 that asks it to save.
trap 'echo "USR1 ignored"' USR1
for i in $(seq 1 1200); do sleep 0.25; done
"""


@pytest.mark.slow
def test_the_slurmd_pod_stays_while_the_node_drains_and_goes_once_drained(
    kube_coordinator: Coordinator, slurm_ctl: CliSlurm, kube_api: KubeApi,
    kube_slurm_nodes: KubeNodes, job_dir: Path,
) -> None:  # fmt: skip
    c = kube_coordinator
    ns = kube_slurm_nodes.namespace
    job_id = slurm_ctl.submit(
        BatchJob(
            script=STUBBORN,
            options={"requeue": None, "output": str(job_dir / "out")},
            workdir=str(job_dir),
        )
    )
    (node,) = wait_for(lambda: running(slurm_ctl, job_id), 30, "the job running").nodes
    pod = kube_slurm_nodes.pods[node]
    c.send(node, "xid95")  # drain-reset: the job is asked to save first; this one will not
    wait_for(lambda: _marked(kube_api, node), 20, f"{node} marked in Kubernetes")
    info = slurm_ctl.node(node)
    assert info.drained
    assert info.state in ("ALLOCATED", "MIXED")  # DRAINING: the job still runs there
    inc = c.incident_on(node)
    assert inc is not None
    marked_at = min(p["at"]["wall"] for p in inc["phases"] if p["name"] == "k8s-marked")
    # Two looks at Slurm after the marking: the step that took the first one has finished its
    # reconcile (steps run one after another), so it has seen the node DRAINING and decided.
    looks: set[float] = set()

    def two_looks() -> bool:
        seen = c.client.get("/v1/status")["seen_at"]
        if seen is not None and seen > marked_at:
            looks.add(seen)
        return len(looks) >= 2

    wait_for(two_looks, 20, "two looks at Slurm after the marking")
    assert slurm_ctl.node(node).state in ("ALLOCATED", "MIXED")
    left = pod_json(kube_api, ns, pod)
    assert left is not None
    assert not left["metadata"].get("deletionTimestamp")  # not while DRAINING
    slurm_ctl.cancel(job_id)  # the job leaves: the node is DRAINED
    wait_for(lambda: gone_or_terminating(kube_api, ns, pod), 30, f"{pod} deleted once drained")
    inc = c.incident_on(node)
    assert inc is not None
    assert _at(inc, "k8s-marked") < _at(inc, "slurmd-pod-deleted")


@pytest.fixture
def slinky_coordinator(
    local_cluster: LocalCluster, slurm_ctl: CliSlurm, kube_api: KubeApi,
    kube_slurm_nodes: KubeNodes, tmp_path: Path,
) -> Iterator[Coordinator]:  # fmt: skip
    yield from _start(local_cluster, kube_api, kube_slurm_nodes, tmp_path, "--slinky")


@pytest.mark.slow
def test_in_a_slinky_cluster_the_operator_is_asked_to_drain(
    slinky_coordinator: Coordinator, slurm_ctl: CliSlurm, kube_api: KubeApi,
    kube_slurm_nodes: KubeNodes,
) -> None:  # fmt: skip
    c = slinky_coordinator
    ns, pod = kube_slurm_nodes.namespace, kube_slurm_nodes.pods["node2"]
    c.send("node2", "xid79")

    def cordoned() -> bool:
        got = pod_json(kube_api, ns, pod)
        return (
            got is not None
            and got["metadata"].get("annotations", {}).get(SLINKY_POD_CORDON) == "true"
        )

    wait_for(cordoned, 20, f"{pod} annotated for the slurm-operator")
    assert slurm_ctl.node("node2").in_service  # we did not call Slurm for the node
    # What Slinky's operator does on that annotation: drain with its own reason.
    slurm_ctl.run(["scontrol", "update", "NodeName=node2", "State=DRAIN",
                   "Reason=slurm-operator: pod-cordon"])  # fmt: skip
    wait_for(lambda: _marked(kube_api, "node2"), 20, "node2 marked in Kubernetes")

    def drained() -> dict[str, Any] | None:
        inc = c.incident_on("node2")
        return inc if inc and "node-drained" in {p["name"] for p in inc["phases"]} else None

    inc = wait_for(drained, 20, "the drain seen")
    (take_out, *_rest) = inc["actions"]
    assert take_out["status"] == "done"
    status = json.loads(c.cli("status", "--json").stdout)
    (row,) = [r for r in status["nodes"] if r["name"] == "node2"]
    assert row["held_by"] == "slinky"
    got = pod_json(kube_api, ns, pod)
    assert got is not None
    assert not got["metadata"].get("deletionTimestamp")  # the operator owns its pods
