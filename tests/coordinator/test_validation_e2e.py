"""Validating nodes before work lands on them, for real: the coordinator (its own process,
policy ``validation.required``), an agent per node, the session's Slurm. ``recover node check``
runs the cheap checks and a real burn-in job on a spare; a spare whose agent died is rejected
when a promotion asks for it, held with the failed check as its reason and never put in
service; once its agent is back and it passes, it returns to the pool and the waiting
promotion takes it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from recovery.pool.spares import SPARE_REASON
from service.daemons import agents as agents_proc
from slurm.cli_slurm import CliSlurm
from tests.coordinator.helpers import Coordinator, phases
from tests.slurm.helpers import down_node, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

#: The agents' heartbeat is every 2 s: an agent silent for 6 s fails its node's check.
AGENT_MAX_AGE_S = 6


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "validation: {required: true, accelerators: 8, max_age_s: 600, "
        f"agent_max_age_s: {AGENT_MAX_AGE_S}, burn_in_budget_s: 120}}\n"
    )
    return path


def _check(coordinator: Coordinator, node: str, *more: str) -> tuple[int, dict[str, Any]]:
    done = coordinator.cli("node", "check", node, "--json", *more)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_spare_is_checked_with_a_real_burn_in_and_the_verdict_shows(
    coordinator: Coordinator, agents: dict[str, int], slurm_ctl: CliSlurm
) -> None:
    rc, doc = _check(coordinator, "spare1")
    assert rc == 0, doc
    assert doc["verdict"] == "passed"
    by = {r["name"]: r for r in doc["results"]}
    assert by["agent"]["ok"] is True
    assert by["incidents"]["ok"] is True
    assert by["accelerators"]["detail"] == "8 device(s) via simulated, all sane"
    assert by["burn-in"]["ok"] is True, by["burn-in"]
    assert "2 process(es), product and collective right" in by["burn-in"]["detail"]
    spare = slurm_ctl.node("spare1")
    assert spare.drained
    assert spare.reason == SPARE_REASON
    status = coordinator.client.get("/v1/status")
    (row,) = [c for c in status["checks"] if c["node"] == "spare1"]
    assert row["verdict"] == "passed"
    assert row["spare"] is True
    text = coordinator.cli("status")
    assert "spare1 (spare)" in text.stdout
    assert "passed" in text.stdout
    # An in-service node is checked without a burn-in; an unknown one is named.
    rc, doc = _check(coordinator, "node1")
    assert rc == 0
    assert doc["results"][-1]["ok"] is None
    bad = coordinator.cli("node", "check", "nodeX")
    assert bad.returncode == 2
    assert "node1" in bad.stderr


def test_a_spare_whose_agent_died_is_rejected_then_taken_once_it_passes(
    coordinator: Coordinator, agents: dict[str, int], slurm_ctl: CliSlurm
) -> None:
    os.kill(agents["spare1"], signal.SIGKILL)

    def silent() -> bool:
        rows = {a["node"]: a for a in coordinator.client.get("/v1/agents")}
        age = rows["spare1"]["last_heartbeat_age_s"]
        return age is not None and age > AGENT_MAX_AGE_S

    wait_for(silent, 30, "spare1's agent silent")
    coordinator.send("node2", "xid79")
    wait_for(lambda: down_node(slurm_ctl, "node2"), 20, "node2 DOWN")

    def held() -> bool:
        return slurm_ctl.node("spare1").reason.startswith("recover: check failed: agent:")

    wait_for(held, 30, "spare1 held out after failing its check")
    inc = wait_for(lambda: coordinator.incident_on("node2"), 10, "the incident")
    seen = phases(inc)
    assert "spare-checking" in seen
    assert "spare-rejected" in seen
    assert "spare-promoted" not in seen
    (rejected,) = [p for p in inc["phases"] if p["name"] == "spare-rejected"]
    assert rejected["detail"].startswith("spare1: failed its check (agent: its agent's last")
    assert slurm_ctl.node("spare1").drained

    # The agent comes back; its node passes a check and returns to the pool, and the
    # promotion that waited takes it.
    assert coordinator.endpoint is not None
    agents_proc.start_agents(coordinator.state_dir, ["spare1"], coordinator.endpoint.url)
    wait_for(lambda: not silent(), 30, "spare1's agent beating again")
    rc, doc = _check(coordinator, "spare1")
    assert rc == 0, doc
    wait_for(lambda: slurm_ctl.node("spare1").in_service, 30, "spare1 promoted")

    def promoted() -> dict[str, Any] | None:
        found = coordinator.incident_on("node2")
        return found if found is not None and "spare-promoted" in phases(found) else None

    inc = wait_for(promoted, 20, "the promotion recorded")
    checks = inc["info"]["spare_checks"]
    assert next(c["verdict"] for c in checks) == "failed: agent"
