"""`recover sbatch --spares S`: the job's options and script (pure), and S=0 as the plain
path. The real-daemon behaviour is tests/slurm/test_inalloc.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recovery.errors import UsageError
from recovery.ports.slurm import NodeInfo
from slurm.sbatch import check_spares_fit, render_batch_script, training_job

CMD = ["recover", "train", "--run-dir", "/r", "--steps", "5"]


def test_zero_spares_is_the_plain_requeue_path() -> None:
    plain = training_job(CMD, sbatch_args=["-N", "2"], processes=2)
    zero = training_job(CMD, sbatch_args=["-N", "2"], processes=2, spares=0)
    assert zero == plain
    assert "supervise-job" not in zero.script
    assert "no-kill" not in zero.options


def test_spares_ask_k_plus_s_nodes_with_no_kill_and_run_the_supervisor() -> None:
    job = training_job(CMD, sbatch_args=["-N", "2", "--time=5"], processes=2, spares=1)
    assert job.options["nodes"] == "3"
    assert "no-kill" in job.options
    assert job.extra_args == ("--time=5",)  # the user's -N 2 no longer overrides K+S
    assert (
        'recover supervise-job --processes 2 --signal-lead 60 --decision-file "$decided" -- '
        "recover train --run-dir /r --steps 5 --auto-resume &"
    ) in job.script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in job.script


def test_python_m_recovery_runs_the_supervisor_the_same_way() -> None:
    script = render_batch_script(
        ["python3", "-m", "recover", "train", "--steps", "3"], signal_lead_s=30, spares=1
    )
    assert "python3 -m recover supervise-job --processes 1" in script


def test_spares_need_recover_train_and_a_count_of_zero_or_more() -> None:
    with pytest.raises(UsageError, match="--spares needs a `recover train` command"):
        render_batch_script(["sleep", "10"], signal_lead_s=30, spares=1)
    with pytest.raises(UsageError, match=r"Invalid --spares -1: expected 0 or more"):
        render_batch_script(CMD, signal_lead_s=30, spares=-1)


def test_max_relaunches_goes_to_the_supervisor_and_needs_spares() -> None:
    job = training_job(CMD, sbatch_args=["-N", "2"], processes=2, spares=1, max_relaunches=5)
    assert "--processes 2 --max-relaunches 5 --signal-lead 60 --decision" in job.script
    default = training_job(CMD, sbatch_args=["-N", "2"], processes=2, spares=1)
    assert "--max-relaunches" not in default.script  # the supervisor's own default
    with pytest.raises(UsageError, match=r"--max-relaunches bounds relaunches .* give --spares"):
        training_job(CMD, sbatch_args=["-N", "2"], processes=2, max_relaunches=2)
    with pytest.raises(UsageError, match=r"Invalid --max-relaunches -1: expected 0 or more"):
        render_batch_script(CMD, signal_lead_s=30, spares=1, max_relaunches=-1)


class _Nodes:
    def __init__(self, nodes: list[NodeInfo]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[NodeInfo]:
        return self._nodes


def test_more_nodes_than_in_service_names_how_many_spares_fit() -> None:
    nodes = [NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"), NodeInfo("n3", "IDLE"),
             NodeInfo("s1", "IDLE", frozenset({"DRAIN"}))]  # fmt: skip
    check_spares_fit(_Nodes(nodes), 2, 1)  # type: ignore[arg-type]
    with pytest.raises(
        UsageError, match=r"asks 5 nodes .* 3 in service \(n1, n2, n3\): at most --spares 1"
    ):
        check_spares_fit(_Nodes(nodes), 2, 3)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not even the 4 processes fit"):
        check_spares_fit(_Nodes(nodes), 4, 1)  # type: ignore[arg-type]


def test_the_supervisor_refuses_a_negative_standby_delay_and_takes_no_standby() -> None:
    base = [sys.executable, "-m", "recover", "supervise-job", "--processes", "1",
            "--decision-file", "/nonexistent/d"]  # fmt: skip
    bad = subprocess.run([*base, "--standby-after", "-1", "--", *CMD],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 2
    assert "Invalid --standby-after -1: expected 0 or more" in bad.stderr
    # --no-standby is accepted; outside a job the supervisor says where it must run.
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    off = subprocess.run([*base, "--no-standby", "--", *CMD], capture_output=True, text=True,
                         timeout=60, check=False, env=env)  # fmt: skip
    assert "SLURM_JOB_ID is not set" in off.stderr + off.stdout
