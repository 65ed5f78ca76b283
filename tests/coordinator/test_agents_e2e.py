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
