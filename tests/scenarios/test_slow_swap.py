"""A slow node under a job that asked to be moved off a straggler, on the requeue path, for
real on Slurm 25.11: the shipped ``slow-node`` scenario (node2's training process held, here,
to 3 % of a CPU at step 30) run with ``RECOVER_STALL_BUDGETS='{"straggler": {"swap": true}}'``
and no spare in the job. node2's agent finds that the steps left would lose more than a move
costs and reports ``node-slow-swap``; the coordinator drains node2, the job saves and is
requeued onto the pool's spare, and completes with the control's digest. The report counts
the time lost before the move and the move itself. Soak tier (about 4 minutes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from scenarios.loader import find
from tests.helpers import RECOVER
from tests.plugins.slurm_cluster import require_2511
from tests.scenarios.test_runs import _check_nothing_left
from tests.slurm.helpers import require_local_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.soak]


def _scenario(directory: Path) -> Path:
    found = find("slow-node")
    assert found.path is not None
    doc = yaml.safe_load(found.path.read_text())
    doc["description"] = "slow-node, its job asking to be moved off a straggler"
    # Held to 3 % of a CPU, under the shipped 4 %: under CI's load (four workers' clusters on
    # 2 cores) every training process has about a tenth of a CPU, so a 10 % quota hardly
    # bound and the node was found slow too late for a move to pay (seen: found at step
    # ~120 of 160, verdict observe). 3 % binds under that load with room to spare.
    (fault,) = doc["faults"]
    fault["cpu_percent"] = 3
    doc["expect"] = {
        "incidents": 1,
        "verdicts": ["drain-reset"],
        "incident_nodes": ["node2"],
        "out_of_service": ["node2"],
        "max_requeues": 1,
        "max_steps_recomputed": 0,
    }
    path = directory / "slow-node-swap.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_slow_node_is_drained_and_the_job_moved_when_it_asked_and_it_pays(
    control_cache: Path, tmp_path: Path
) -> None:
    require_local_slurm()
    require_2511()
    out = tmp_path / "run"
    # A move priced at 10 s, not the default 60: under load (CI's four workers on 2 cores) the
    # healthy step is slower and the throttle costs less, so a 60 s move may rightly not pay
    # in a 100-step job (seen: 22 s to save); this tests that a move that pays is made.
    rule = {"swap": True, "swap_cost_s": 10}
    env = {**os.environ, "RECOVER_STALL_BUDGETS": json.dumps({"straggler": rule})}
    done = subprocess.run(
        [*RECOVER, "scenario", "run", str(_scenario(tmp_path)), "--out", str(out), "--cache",
         str(control_cache), "--json", "--no-budgets", "--slurm", "25.11", "--mode", "requeue"],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert result["passed"], result["checks"]
    report = json.loads((out / "report.json").read_text())
    (inc,) = report["incidents"]
    assert inc["verdict"] == "drain-reset"
    # Asked for at once, or after a node-slow when the move came to pay (it then joins it).
    assert inc["fault"] in ("node-slow-swap", "node-slow")
    # The agent's own words: node-slow first or not, it asked for the move.
    agent_log = out / "cluster" / "coordinator" / "agents" / "node2" / "agent.log"
    assert "node-slow-swap" in agent_log.read_text()
    (slow,) = report["slowdowns"]
    assert slow["node"] == "node2"
    assert slow["swap"] == "swapped"
    assert slow["lost_before_s"] > 0
    assert slow["swap_s"] is not None
    # After the move the job runs at its healthy pace again: it loses far less over the steps
    # left than the slow node would have (throttled at step 30 of 160).
    steps_after = 160 - 30 - slow["steps_slow"]
    left_in = (slow["slow_step_s"] - slow["baseline_step_s"]) * steps_after
    assert slow["lost_after_s"] < left_in / 2, (slow, left_in)
    _check_nothing_left(Path(result["cluster_root"]))
