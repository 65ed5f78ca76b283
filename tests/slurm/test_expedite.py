"""Expedited requeue on real Slurm 25.11 (``--requeue=expedite``,
``SlurmctldParameters=enable_expedited_requeue``, ``ReturnToService=1``), and our Epilog.

* A job whose node is set DOWN is requeued and runs again at once on another node, never on
  the node it failed on.
* A job whose script fails on a node with an open incident: our Epilog asks the coordinator
  (a real one, in dry-run so that it decides but does not act itself), drains the node with
  our reason and fails, so Slurm requeues the job by itself; it runs again elsewhere, never on
  that node, which keeps our reason.
* A failed expedited job with no incident is held by Slurm (REQUEUE_HOLD); our requeue
  releases it, and so does the requeue of its ended run (``requeue_ended``), which is how a
  real coordinator brings back a job whose training died before the fault was reported.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import epilog
from recovery import statedir
from recovery.model.events import HealthEvent, Source
from recovery.ports.slurm import BatchJob, JobInfo
from service.daemons import coordinator as coordinator_proc
from service.httpapi.client import Client, admin_token
from slurm import procs
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from slurm.sbatch import expedite_allowed
from tests.plugins.slurm_cluster import require_2511, reset
from tests.slurm.helpers import SLURMD_TIMEOUT_S, output_lines, require_local_slurm, wait_for

pytestmark = pytest.mark.slurm

#: Appends "jobid restarts node i" to $OUT until $STOP exists, then fails (as training that
#: died would end its batch script).
FAILING_LOOP = """#!/bin/bash
for i in $(seq 1 600); do
    echo "$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} $SLURMD_NODENAME $i" >> "$OUT"
    if [ -e "$STOP.${SLURM_RESTART_COUNT:-0}" ]; then exit 134; fi
    sleep 0.3
done
"""


def submit(ctl: CliSlurm, job_dir: Path, *, expedite: bool = True) -> str:
    # Variables go into the script: any --export but ALL makes slurmd load root's login shell.
    script = FAILING_LOOP.replace(
        "#!/bin/bash\n", f"#!/bin/bash\nexport OUT={job_dir / 'out'} STOP={job_dir / 'stop'}\n"
    )
    return ctl.submit(
        BatchJob(
            script=script,
            options={
                "requeue": "expedite" if expedite else None,
                "open-mode": "append",
                "job-name": "expedite",
                "output": str(job_dir / "slurm-%j.out"),
            },
            workdir=str(job_dir),
        )
    )


def runs_on(ctl: CliSlurm, job_id: str, restarts: int) -> str | None:
    job = ctl.job(job_id)
    if job.state == "RUNNING" and job.restart_count == restarts and job.nodes:
        return job.nodes[0]
    return None


def nodes_of_run(job_dir: Path, restarts: int) -> set[str]:
    return {line[2] for line in output_lines(job_dir, restarts)}


@pytest.fixture
def ctl2511(local_cluster_2511: LocalCluster) -> Iterator[CliSlurm]:
    ctl = local_cluster_2511.control()
    reset(local_cluster_2511, ctl)
    yield ctl
    reset(local_cluster_2511, ctl)


def test_the_local_2511_cluster_takes_expedited_requeue(ctl2511: CliSlurm) -> None:
    assert expedite_allowed(ctl2511)


@pytest.mark.slow
def test_a_job_whose_node_goes_down_runs_again_elsewhere_never_there(
    ctl2511: CliSlurm, job_dir: Path
) -> None:
    job_id = submit(ctl2511, job_dir)
    first = wait_for(lambda: runs_on(ctl2511, job_id, 0), 30, "the first run")
    assert ctl2511.down(first, "expedite test")
    second = wait_for(lambda: runs_on(ctl2511, job_id, 1), 30, "the run after the requeue")
    assert second != first
    wait_for(lambda: output_lines(job_dir, 1), 15, "output of the second run")
    assert first not in nodes_of_run(job_dir, 1)
    assert ctl2511.node(first).down  # ReturnToService=1: our DOWN holds


@pytest.mark.slow
def test_a_failed_expedited_job_without_an_incident_is_held_until_we_requeue_it(
    ctl2511: CliSlurm, job_dir: Path
) -> None:
    job_id = submit(ctl2511, job_dir)
    wait_for(lambda: runs_on(ctl2511, job_id, 0), 30, "the first run")
    (job_dir / "stop.0").touch()

    def held() -> JobInfo | None:
        job = ctl2511.job(job_id)
        return job if job.state == "REQUEUE_HOLD" else None

    got = wait_for(held, 30, "the held requeue")
    assert (got.nodes, got.restart_count) == ((), 1)  # requeued already; holds no node
    assert ctl2511.requeue(job_id) is True  # released
    wait_for(lambda: runs_on(ctl2511, job_id, 1), 30, "the run after the release")


def test_the_requeue_of_an_ended_run_that_slurm_holds_is_its_release(
    ctl2511: CliSlurm, job_dir: Path
) -> None:
    """``requeue_ended`` of run 0, which Slurm requeued itself and holds (at count 1),
    releases it once; asked again (a coordinator restarted in between), it is a no-op."""
    job_id = submit(ctl2511, job_dir)
    wait_for(lambda: runs_on(ctl2511, job_id, 0), 30, "the first run")
    (job_dir / "stop.0").touch()
    wait_for(lambda: ctl2511.job(job_id).state == "REQUEUE_HOLD", 30, "the held requeue")
    assert ctl2511.requeue_ended(job_id, 1) is False  # not run 1's: untouched
    assert ctl2511.job(job_id).state == "REQUEUE_HOLD"
    assert ctl2511.job(job_id).requeue_held
    assert ctl2511.requeue_ended(job_id, 0) is True
    # Slurm shows REQUEUE_HOLD until the job starts, with the hold's reason gone.
    assert not ctl2511.job(job_id).requeue_held
    assert ctl2511.requeue_ended(job_id, 0) is False
    wait_for(lambda: runs_on(ctl2511, job_id, 1), 30, "the run after the release")
    assert ctl2511.job(job_id).restart_count == 1  # released, not requeued a second time


@pytest.mark.slow
def test_training_that_died_before_the_fault_was_reported_is_released_by_the_coordinator(
    local_cluster_2511: LocalCluster, ctl2511: CliSlurm, job_dir: Path, tmp_path: Path
) -> None:
    """The way a lost GPU goes when the report is slow: the process dies, the batch script
    fails, no incident is open yet, so Slurm holds the expedited job (no Epilog failed; this
    cluster runs none). The fault's report then reaches a real, acting coordinator: it takes
    the node out and releases the job, which runs again elsewhere, never there."""
    state = tmp_path / "coordinator"
    ep = coordinator_proc.start(
        state, slurm_conf=local_cluster_2511.conf_path, extra_args=("--slurm-backend", "cli")
    )
    try:
        client = Client(ep.url, admin_token(state / statedir.TOKENS_FILE))
        job_id = submit(ctl2511, job_dir)
        first = wait_for(lambda: runs_on(ctl2511, job_id, 0), 30, "the first run")
        since = time.time()
        wait_for(lambda: (client.get("/v1/status")["seen_at"] or 0) > since + 1, 30,
                 "a coordinator tick that saw the job running")  # fmt: skip
        (job_dir / "stop.0").touch()  # training died: the batch script fails
        wait_for(lambda: ctl2511.job(job_id).state == "REQUEUE_HOLD", 30, "Slurm's hold")
        assert client.get("/v1/incidents") == []  # a failing job says nothing by itself
        report(client, first, "xid79")
        second = wait_for(lambda: runs_on(ctl2511, job_id, 1), 60, "the run after the release")
        assert second != first
        assert ctl2511.node(first).down
        wait_for(lambda: output_lines(job_dir, 1), 15, "output of the second run")
        assert first not in nodes_of_run(job_dir, 1)
        (inc,) = [i for i in client.get("/v1/incidents") if i["node"] == first]
        phases = {
            p["name"]: p["detail"] for p in client.get(f"/v1/incidents/{inc['id']}")["phases"]
        }
        assert phases["job-ended"] == f"{job_id} FAILED exit 134, held by Slurm"
        assert phases["jobs-requeued"].endswith("requeued by the coordinator)")
    finally:
        coordinator_proc.stop(state)


@pytest.mark.slow
def test_training_stopped_by_hand_is_held_by_slurm_and_released_by_the_coordinator(
    local_cluster_2511: LocalCluster, ctl2511: CliSlurm, job_dir: Path, tmp_path: Path
) -> None:
    """Someone sends the training process SIGTERM (docs/library.md: it saves, exits 75, and
    the next run continues). The batch script passes 75 on; Slurm 25.11 requeues the
    expedited job held, and nothing would release it. The coordinator finds the hold, opens
    a job-held incident saying why, releases the job, and the job continues from its
    checkpoint to the end."""
    from recovery.contract.exits import EXIT_PREEMPTED
    from slurm.sbatch import submit_training
    from tests.coordinator.helpers import events
    from tests.helpers import RECOVER_SCRIPT

    state = tmp_path / "coordinator"
    ep = coordinator_proc.start(
        state, slurm_conf=local_cluster_2511.conf_path, extra_args=("--slurm-backend", "cli")
    )
    try:
        client = Client(ep.url, admin_token(state / statedir.TOKENS_FILE))
        run = job_dir / "run"
        train = ["--steps", "30", "--save-every", "5", "--step-sleep", "0.2"]
        job_id = submit_training(
            ctl2511,
            [RECOVER_SCRIPT, "train", "--run-dir", str(run), *train],
            sbatch_args=[f"--output={job_dir}/run-%j.out", f"--chdir={job_dir}"],
        )
        wait_for(lambda: sum(e["event"] == "step" for e in events(run)) >= 6, 180, "steps")
        (started,) = [e for e in events(run) if e["event"] == "started"]
        os.kill(int(started["pid"]), signal.SIGTERM)  # by hand: not Slurm's warning
        def held() -> JobInfo | None:
            job = ctl2511.job(job_id)
            return job if job.requeue_held else None

        assert wait_for(held, 60, "the hold").exit_code == EXIT_PREEMPTED
        wait_for(lambda: ctl2511.job(job_id).state == "COMPLETED", 240, "completed", 1.0)
        assert ctl2511.job(job_id).restart_count == 1
        evs = events(run)
        (restored,) = [e for e in evs if e["event"] == "restored"]
        (preempted,) = [e for e in evs if e["event"] == "preempted"]
        assert restored["step"] == preempted["step"]  # nothing lost: it saved on the way out
        assert [e["step"] for e in evs if e["event"] == "completed"] == [30]
        (inc,) = [i for i in client.get("/v1/incidents") if i["fault"] == "job-held"]
        inc = client.get(f"/v1/incidents/{inc['id']}")
        phases = {p["name"]: p["detail"] for p in inc["phases"]}
        assert phases["decided"].startswith(f"job {job_id} (recover-train) is held by Slurm")
        assert "exit 75" in phases["job-released"]
        assert {"job-running", "closed"} <= set(phases)
        assert inc["jobs"] == [job_id]
    finally:
        coordinator_proc.stop(state)


# --- our Epilog and a real coordinator --------------------------------------------------------


@pytest.fixture(scope="module")
def epilog_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, Client]]:
    """A 25.11 cluster running our Epilog, and a real coordinator in dry-run (it opens
    incidents but takes no action itself, so what moves the job is Slurm and our Epilog)."""
    require_local_slurm()
    built = require_2511()
    root = tmp_path_factory.mktemp("epilog2511")
    coord = root / "coordinator"
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    cluster = LocalCluster(
        root / "slurm", slurmd_timeout_s=SLURMD_TIMEOUT_S, install=built, expedite=True,
        epilog=[python, "-I", epilog.__file__, "--coordinator-dir", str(coord)],
    )  # fmt: skip
    info = cluster.up(nodes=3, spares=0)
    try:
        ep = coordinator_proc.start(
            coord, slurm_conf=info.conf_path, dry_run=True, extra_args=("--slurm-backend", "cli")
        )
        yield cluster, Client(ep.url, admin_token(coord / statedir.TOKENS_FILE))
    finally:
        coordinator_proc.stop(coord)
        cluster.down()
        assert not procs.cluster_processes(str(cluster.state_dir))


def report(client: Client, node: str, fault: str) -> None:
    event = HealthEvent(
        id=f"epilog-test-{os.getpid()}-{time.monotonic_ns()}", node=node, source=Source.injected,
        fault=fault, observed_at=time.time(), injected=True,
    )  # fmt: skip
    client.post("/v1/events", {"events": [event.model_dump(mode="json")]})


def open_incident(client: Client, node: str) -> bool:
    return any(i["node"] == node for i in client.get("/v1/incidents?open=true"))


@pytest.mark.slow
def test_a_job_that_failed_on_a_faulted_node_is_requeued_by_slurm_never_onto_it(
    epilog_cluster: tuple[LocalCluster, Client], tmp_path: Path
) -> None:
    cluster, client = epilog_cluster
    ctl = cluster.control()
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    job_id = submit(ctl, job_dir)
    first = wait_for(lambda: runs_on(ctl, job_id, 0), 30, "the first run")
    report(client, first, "xid79")
    wait_for(lambda: open_incident(client, first), 15, "the coordinator's incident")
    (job_dir / "stop.0").touch()  # training died: the batch script fails
    second = wait_for(lambda: runs_on(ctl, job_id, 1), 30, "Slurm's own requeue")
    assert second != first
    node = ctl.node(first)
    assert node.drained
    assert node.reason.startswith("recover: xid79")  # ours, not Slurm's "Epilog error"
    wait_for(lambda: output_lines(job_dir, 1), 15, "output of the second run")
    assert first not in nodes_of_run(job_dir, 1)
    ctl.cancel(job_id)
    ctl.resume(first)
