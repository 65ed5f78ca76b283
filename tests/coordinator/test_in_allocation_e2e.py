"""Recovery inside the allocation with the real coordinator and agents (issue 16): XID 79 on
a node of a `recover sbatch -N 2 --spares 1` job. The training process there dies (SIGABRT,
no save) and the agent reports the XID; the coordinator sets the node DOWN, Slurm drops it
from the --no-kill job, the job's supervisor relaunches on its own spare, and the job is never
requeued. The incident records `in-allocation` and closes; the pool spare is still promoted,
as a refill of the cluster."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from slurm.cli_slurm import CliSlurm
from slurm.sbatch import submit_training
from tests.coordinator.helpers import Coordinator, phases
from tests.helpers import RECOVER_SCRIPT
from tests.slurm.helpers import down_node, wait_for
from tests.train import multi

# The demo's second run (xid79 in-allocation, with the coordinator and agents) covers this path
# in the whole tier; this variant (a job submitted with `recover sbatch --spares`) soaks.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.soak]

ARGS = ["--steps", "16", "--save-every", "3", "--model", "mlp-tiny", "--step-sleep", "0.3"]


def test_xid79_in_a_job_with_spares_is_absorbed_in_its_allocation(
    coordinator: Coordinator, agents: dict[str, int], slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    run = job_dir / "run"
    job_id = submit_training(
        slurm_ctl,
        [RECOVER_SCRIPT, "train", "--run-dir", str(run), *ARGS],
        sbatch_args=["--nodes=2", f"--output={job_dir}/run-%j.out", f"--chdir={job_dir}"],
        signal_lead_s=30,
        processes=2,
        spares=1,
    )
    wait_for(lambda: bool(multi.of(run, "checkpoint").get(1)), 240, "a checkpoint")
    (joined,) = multi.of(run, "joined")[1]
    node = str(multi.of(run, "started")[1][0]["node"])
    os.kill(int(joined["pid"]), signal.SIGABRT)  # the GPU is lost: training dies, no save
    done = coordinator.cli("inject", "--fault", "xid79", "--node", node, "--via", "kmsg",
                           "--wait", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_for(lambda: down_node(slurm_ctl, node), 20, f"{node} DOWN")

    wait_for(lambda: slurm_ctl.job(job_id).state == "COMPLETED", 300, "the job to complete")
    job = slurm_ctl.job(job_id)
    assert job.restart_count == 0
    assert node not in job.nodes
    journal = job_dir / f"supervisor-{job_id}.jsonl"
    rows = [json.loads(ln) for ln in journal.read_text().splitlines()]
    (relaunch,) = [r for r in rows if r["event"] == "relaunch"]
    assert relaunch["lost"] == [node]

    inc = wait_for(
        lambda: (i := coordinator.incident_on(node)) and i["status"] == "closed" and i,
        60,
        "the incident closed",
    )
    names = phases(inc)
    assert "in-allocation" in names
    assert "spare-promoted" in names  # the pool refill
    assert "jobs-requeued" not in names
    (detail,) = [p["detail"] for p in inc["phases"] if p["name"] == "in-allocation"]
    assert detail.startswith(f"{job_id}@")
    assert node not in detail
    multi.run(job_dir / "control", 2, 16, 3, "--model", "mlp-tiny")
    assert multi.final_digest(run, 2) == multi.final_digest(job_dir / "control", 2)
