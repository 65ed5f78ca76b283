"""Node agents (real processes, one per node) -> the real coordinator -> real Slurm:
`recover inject` travels the same path a real fault does."""

from __future__ import annotations

import json

import pytest

from slurm.cli_slurm import CliSlurm
from tests.coordinator.helpers import Coordinator
from tests.slurm.helpers import down_node, wait_for

pytestmark = pytest.mark.slurm


@pytest.mark.slow
@pytest.mark.parametrize("via", ["agent", "kmsg"])
def test_injected_xid79_reaches_a_decision_and_the_node_goes_down(
    coordinator: Coordinator, agents: dict[str, int], slurm_ctl: CliSlurm, via: str
) -> None:
    done = coordinator.cli("inject", "--fault", "xid79", "--node", "node2", "--via", via,
                           "--wait", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    event_id = answer["event_id"]
    down = wait_for(lambda: down_node(slurm_ctl, "node2"), 20, "node2 DOWN")
    assert down.reason == "recover: xid79 GPU has fallen off the bus"
    inc = wait_for(lambda: coordinator.incident_on("node2"), 10, "the incident")
    assert inc["event_ids"] == [event_id]
    (stored,) = coordinator.client.get(f"/v1/incidents/{inc['id']}")["events"]
    assert stored["event"]["source"] == ("injected" if via == "agent" else "kmsg")
    assert stored["event"]["injected"] is (via == "agent")


@pytest.mark.slow
def test_inject_refuses_unknown_faults_and_nodes_and_records_nothing(
    coordinator: Coordinator, agents: dict[str, int]
) -> None:
    bad_fault = coordinator.cli("inject", "--fault", "xid9999x", "--node", "node1")
    assert bad_fault.returncode == 2
    assert "xid79" in bad_fault.stderr  # the known faults are listed
    bad_node = coordinator.cli("inject", "--fault", "xid79", "--node", "nodeX")
    assert bad_node.returncode == 2
    assert "node1" in bad_node.stderr
    assert coordinator.client.get("/v1/incidents") == []


@pytest.mark.slow
def test_a_node_resumed_by_hand_takes_a_new_fault_as_new(
    coordinator: Coordinator, slurm_ctl: CliSlurm
) -> None:
    """An operator resumes a node we took out (`scontrol update state=resume`, as after a
    quick reboot); 40 s later the same fault there opens a new incident that takes the node
    out again and counts (escalated or flapping), instead of joining the old one as a repeat
    within the flood window while the node takes the next job on a lost GPU."""
    first_id = coordinator.send("node2", "xid79")
    wait_for(lambda: down_node(slurm_ctl, "node2"), 20, "node2 DOWN")
    first = wait_for(lambda: coordinator.incident_on("node2"), 10, "the incident")
    slurm_ctl.run(["scontrol", "update", "nodename=node2", "state=resume"])

    def let_go() -> bool:
        inc = coordinator.client.get(f"/v1/incidents/{first['id']}")
        return "back-in-service" in [p["name"] for p in inc["phases"]]

    wait_for(let_go, 30, "the incident lets node2 go")
    assert not slurm_ctl.node("node2").out_of_service
    second_id = coordinator.send("node2", "xid79")
    down = wait_for(lambda: down_node(slurm_ctl, "node2"), 20, "node2 DOWN again")
    assert down.reason.startswith("recover: xid79")
    second = wait_for(
        lambda: (i := coordinator.incident_on("node2")) and i["id"] != first["id"] and i,
        10,
        "a second incident",
    )
    assert second["event_ids"] == [second_id] != [first_id]
    decided = next(p for p in second["phases"] if p["name"] == "decided")
    assert "joins incident" not in decided["detail"]
    assert "escalat" in decided["detail"] or "flapping" in decided["detail"]
