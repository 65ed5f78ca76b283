"""What only the REST backend on Slurm 25.11 (v0.0.44) has to show, on the real daemon.

v0.0.44 has no requeue request; the refusal names what works instead, and this proves one of
those paths on a real job: a job submitted as ``recover sbatch`` submits it (through slurmrestd:
batch-only ``--signal=B:USR1``, ``--requeue=expedite``), sent USR1 through slurmrestd (to the
batch shell only), saves and requeues itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.errors import SlurmUnsupportedError
from slurm import install
from slurm.cli_slurm import CliSlurm
from slurm.rest_slurm import V44, RestSlurm, connect
from slurm.restd import RestEndpoint
from slurm.sbatch import training_job
from tests.slurm.helpers import running, wait_for

pytestmark = pytest.mark.slurm

#: Stands in for `recover train`: on USR1 it "saves" (a line) and exits 75, as training does.
TRAINING = [
    "bash", "-c",
    'trap \'echo "saved at $SLURM_RESTART_COUNT" >> "$0"; exit 75\' USR1; '
    'echo "started ${SLURM_RESTART_COUNT:-0}" >> "$0"; while :; do sleep 0.2; done',
]  # fmt: skip


@pytest.fixture
def rest44(request: pytest.FixtureRequest) -> Iterator[tuple[RestSlurm, CliSlurm]]:
    cluster = request.getfixturevalue("local_cluster_2511")
    endpoint: RestEndpoint = request.getfixturevalue("rest_endpoint_2511")
    admin = cluster.control()
    # The job's environment is the backend's: the build's programs first, so the batch
    # script's own `scontrol requeue` is 25.11's.
    env = install.command_env(cluster.install, os.environ)
    ctl = connect(url=endpoint.url, token_file=endpoint.token_file, user=endpoint.user, env=env)
    yield ctl, admin
    ctl.close()
    admin.run(["scancel", "--user=root"])


def test_it_speaks_v0_0_44_and_refuses_requeue_naming_what_works(
    rest44: tuple[RestSlurm, CliSlurm], job_dir: Path
) -> None:
    ctl, _ = rest44
    assert ctl.api_version == V44
    assert ctl.unsupported == {"requeue"}
    job = training_job(["sleep", "600"], workdir=str(job_dir), expedite=True)
    job_id = ctl.submit(job)
    wait_for(lambda: running(ctl, job_id), 30, "the job running")
    with pytest.raises(SlurmUnsupportedError, match=r"set its node DOWN.*USR1"):
        ctl.requeue(job_id)


def test_a_recover_sbatch_job_sent_usr1_over_rest_requeues_itself(
    rest44: tuple[RestSlurm, CliSlurm], job_dir: Path
) -> None:
    ctl, admin = rest44
    log = job_dir / "training.log"
    command = [*TRAINING, str(log)]
    job = training_job(
        command, workdir=str(job_dir), expedite=True,
        sbatch_args=[f"--output={job_dir / 'slurm-%j.out'}"],
    )  # fmt: skip
    job_id = ctl.submit(job)
    wait_for(lambda: running(ctl, job_id), 30, "the first run")
    wait_for(lambda: log.exists() and "started 0" in log.read_text(), 15, "training started")
    assert ctl.signal_job(job_id, "USR1") is True
    wait_for(lambda: ctl.job(job_id).restart_count == 1, 30, "the job's own requeue")
    wait_for(lambda: "started 1" in log.read_text(), 30, "the second run")
    lines = log.read_text().splitlines()
    # Saved once (the batch shell forwarded the one USR1; the training got no second one).
    assert lines[:3] == ["started 0", "saved at ", "started 1"], lines
    assert admin.job(job_id).restart_count == 1
