"""The hang scenarios with the job holding a spare (``--mode in-allocation``), for real on
Slurm 25.11: the job's supervisor judges its launch stalled from the progress records, waits
for the agents' stacks, ends the launch and relaunches it on the same nodes from the
survivors' memory; the coordinator opens the incident but leaves the job to its supervisor
(``left-to-job``), so the job is never requeued. main-thread-hang runs in the whole tier,
process-freeze in the soak tier."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import RECOVER
from tests.plugins.slurm_cluster import require_2511
from tests.scenarios.test_runs import _check_nothing_left
from tests.slurm.helpers import require_local_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.parametrize(
    ("name", "culprit_why"),
    [
        ("main-thread-hang", "did not enter step"),
        pytest.param("process-freeze", "frozen", marks=pytest.mark.soak),
    ],
)
def test_a_hang_is_relaunched_inside_the_allocation(
    name: str, culprit_why: str, control_cache: Path, tmp_path: Path
) -> None:
    require_local_slurm()
    require_2511()
    out = tmp_path / "run"
    done = subprocess.run(
        [*RECOVER, "scenario", "run", name, "--out", str(out), "--cache", str(control_cache),
         "--json", "--no-budgets", "--slurm", "25.11", "--mode", "in-allocation"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert (result["scenario"], result["passed"]) == (name, True)
    names = {c["name"] for c in result["checks"] if c["ok"]}
    assert {"max_requeues", "max_steps_recomputed", "incident_phases left-to-job"} <= names
    journal = [json.loads(line) for line in (out / "supervisor-1.jsonl").read_text().splitlines()]
    events = [e["event"] for e in journal]
    # Judged, its stacks awaited, ended, relaunched once on the same nodes, then completed.
    assert events.count("stalled") == 1, events
    (stalled,) = [e for e in journal if e["event"] == "stalled"]
    assert stalled["confident"], stalled
    assert [c["node"] for c in stalled["culprits"]] == ["node2"]
    assert culprit_why in stalled["culprits"][0]["why"]
    (stacks,) = [e for e in journal if e["event"] == "stacks"]
    assert stacks["missing"] == []
    launches = [e["nodes"] for e in journal if e["event"] == "launched"]
    assert len(launches) == 2
    assert launches[0] == launches[1]
    assert events.index("stacks") < events.index("relaunch") < events.index("finish")
    assert journal[-1]["event"] == "finish"
    assert journal[-1]["status"] == 0
    _check_nothing_left(Path(result["cluster_root"]))
