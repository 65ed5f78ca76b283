"""The burn-in of a node out of service, as a real job on the local cluster
(``slurm.burnin.SlurmBurnIn``): a spare is reserved, resumed, burned in with real JAX in two
processes, and put back drained with its reason; nothing else lands on it meanwhile; a node
whose slurmd is gone fails within the budget and stays out."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.pool.spares import SPARE_REASON
from recovery.ports.slurm import BatchJob
from slurm.burnin import RESERVATION_PREFIX, SlurmBurnIn
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from tests.slurm.helpers import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _reservations(ctl: CliSlurm) -> str:
    return ctl.run(["scontrol", "show", "reservation"]).strip()


def test_a_spare_is_burned_in_and_put_back_as_it_was(slurm_ctl: CliSlurm, tmp_path: Path) -> None:
    # A job that asks for the spare by name waits: the spare is drained. The burn-in resumes
    # the spare for a moment; the reservation must keep this job off it all along.
    waiting = slurm_ctl.submit(
        BatchJob("#!/bin/bash\nsleep 30\n", {"nodelist": "spare1", "job-name": "wants-spare1",
                 "output": str(tmp_path / "waiting.out")})
    )  # fmt: skip
    outcome = SlurmBurnIn(slurm_ctl, tmp_path / "burn").run("spare1", 240, SPARE_REASON)
    assert outcome.ok, outcome
    assert "2 process(es), product and collective right" in outcome.detail
    assert outcome.job_id
    assert outcome.took_s > 0
    spare = slurm_ctl.node("spare1")
    assert spare.drained
    assert spare.reason == SPARE_REASON
    burn = slurm_ctl.job(outcome.job_id)
    assert burn.state == "COMPLETED"
    assert burn.nodes == ("spare1",)
    job = slurm_ctl.job(waiting)
    assert job.state == "PENDING", job
    assert not job.nodes, job
    assert RESERVATION_PREFIX not in _reservations(slurm_ctl)


def test_a_node_whose_slurmd_is_gone_fails_in_its_budget_and_stays_out(
    slurm_ctl: CliSlurm, slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    slurm_cluster.crash_node("spare1")
    outcome = SlurmBurnIn(slurm_ctl, tmp_path / "burn").run("spare1", 8, SPARE_REASON)
    assert not outcome.ok
    assert "did not finish within 8 s" in outcome.detail
    assert "cancelled" in outcome.detail
    spare = slurm_ctl.node("spare1")
    assert spare.drained
    assert spare.reason == SPARE_REASON
    wait_for(lambda: slurm_ctl.job(outcome.job_id).finished, 30, "the burn-in job cancelled")
    assert RESERVATION_PREFIX not in _reservations(slurm_ctl)
