"""A scenario on a cluster that is already up (``cluster.existing`` / ``recover scenario run
--slurm-conf ... --coordinator ...``): the session's Slurm cluster with a coordinator and an
agent per node the test started. The runner only talks to them, and stops none of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recovery import statedir
from recovery.errors import UsageError
from scenarios import render
from scenarios.loader import find
from scenarios.runner import RunOptions, run
from scenarios.schema import ExistingCluster
from service.daemons import coordinator as coordinator_proc
from slurm.cluster import LocalCluster
from tests.coordinator.helpers import Coordinator

pytestmark = pytest.mark.slurm


def _existing(cluster: LocalCluster, coordinator: Coordinator) -> ExistingCluster:
    assert coordinator.endpoint is not None
    return ExistingCluster(
        slurm_conf=str(cluster.conf_path),
        coordinator=coordinator.endpoint.url,
        token_file=str(coordinator.state_dir / statedir.TOKENS_FILE),
    )


@pytest.mark.slow
def test_a_scenario_runs_on_an_existing_cluster_and_leaves_it_running(
    local_cluster: LocalCluster,
    coordinator: Coordinator,
    agents: dict[str, int],
    control_cache: Path,
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    existing = _existing(local_cluster, coordinator)
    opts = RunOptions(out=tmp_path / "run", cache=control_cache, say=lines.append,
                      enforce_budgets=False, existing=existing)  # fmt: skip
    result = run(find("xid94"), opts)
    assert result.passed, "\n".join(lines) + "\n" + render.result_text(result)
    assert any("existing cluster" in ln and "nodes node1, node2, node3" in ln for ln in lines)
    # XID 94 kills the training where it strikes; here the runner cannot, and says so.
    assert any("on an existing cluster the runner cannot" in ln for ln in lines)
    assert local_cluster.status().running
    assert coordinator.endpoint is not None
    assert coordinator_proc.healthy(coordinator.endpoint.url)
    # The incident is the coordinator's own, in its journal, as the run directory says.
    (inc,) = coordinator.incidents()
    assert (inc["node"], inc["fault"], inc["verdict"]) == ("node2", "xid94", "restart-app")


def test_a_scenario_that_needs_the_local_cluster_is_refused_before_anything_starts(
    local_cluster: LocalCluster, coordinator: Coordinator, control_cache: Path, tmp_path: Path
) -> None:
    opts = RunOptions(out=tmp_path / "run", cache=control_cache, say=lambda _: None,
                      existing=_existing(local_cluster, coordinator))  # fmt: skip
    jobs_before = local_cluster.control().jobs()
    with pytest.raises(UsageError, match=r"cannot run on an existing cluster: "
                       r"faults\[0\]\.fault: slurmd-crash needs the local cluster"):  # fmt: skip
        run(find("slurmd-crash"), opts)
    assert coordinator.incidents() == []
    assert local_cluster.control().jobs() == jobs_before
    assert not (tmp_path / "run").exists()


IGNORED = """\
description: an XID the catalogue ignores, expected to open an incident (so it fails)
job: {steps: 6, save_every: 3, step_sleep: 0.2}
faults:
  - fault: xid43
    node: node1
    when: {step: 2}
expect:
  digest_matches_control: false
  incidents: 1
"""


@pytest.mark.slow
def test_a_failed_expectation_exits_10_saying_which_and_by_how_much(
    local_cluster: LocalCluster,
    coordinator: Coordinator,
    agents: dict[str, int],
    control_cache: Path,
    tmp_path: Path,
) -> None:
    existing = _existing(local_cluster, coordinator)
    assert existing.slurm_conf is not None
    assert existing.coordinator is not None
    assert existing.token_file is not None
    path = tmp_path / "ignored.yaml"
    path.write_text(IGNORED)
    done = subprocess.run(
        [sys.executable, "-m", "recover", "scenario", "run", str(path), "--out",
         str(tmp_path / "run"), "--cache", str(control_cache), "--slurm-conf",
         existing.slurm_conf, "--coordinator", existing.coordinator, "--token-file",
         existing.token_file],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 10, done.stdout + done.stderr
    assert "FAIL incidents: 0 incident(s) opened, expected 1 (-1)" in done.stdout
    assert "ok   completes: the job ended COMPLETED" in done.stdout
    assert done.stderr.strip().endswith(
        "recover: scenario ignored failed: incidents (0 incident(s) opened, expected 1 (-1))"
    )
    assert json.loads((tmp_path / "run" / "result.json").read_text())["passed"] is False
