"""Helpers shared by the Slurm tests: polling, a stand-in requeueable job and its output, and
the sample training command with its golden batch script. No fixtures here (see conftest)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from recovery.errors import SlurmUnsupportedError
from recovery.ports.slurm import BatchJob, JobInfo, NodeInfo, SlurmControl
from slurm.cluster import REQUIRED_PROGRAMS

T = TypeVar("T")

#: How soon (s) slurmctld declares a silent slurmd's node DOWN in the test cluster.
SLURMD_TIMEOUT_S = 6

GOLDEN = Path(__file__).parent / "golden" / "train.sbatch"
TRAIN = ["recover", "train", "--run-dir", "/runs/demo 1", "--steps", "100", "--save-every", "10"]

LOOP = """#!/bin/bash
for i in $(seq 1 600); do
    echo "$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} $SLURMD_NODENAME $i" >> "$OUT"
    sleep 0.5
done
"""


def require_local_slurm() -> None:
    """Skip (fail in CI) the calling test unless a local cluster can start here: Slurm and
    munge installed, and this process running as root."""
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing and os.environ.get("CI"):
        # .ci/run installs Slurm; a silent skip there would hide the whole tier.
        pytest.fail(f"Slurm tier cannot run in CI: {', '.join(missing)} not on PATH")
    if missing:
        pytest.skip(
            f"Slurm tier skipped: {', '.join(missing)} not installed "
            "(apt-get install -y slurm-wlm munge, or ./scripts/setup.sh)"
        )
    if os.geteuid() != 0:
        pytest.skip("Slurm tier skipped: the local cluster must run as root")


def wait_for(
    probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.25
) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")


def submit_loop(ctl: SlurmControl, job_dir: Path) -> str:
    """A requeueable stand-in job appending "jobid restarts node i" lines to job_dir/out."""
    return ctl.submit(
        BatchJob(
            script=LOOP,
            options={
                "requeue": None,
                "open-mode": "append",
                "job-name": "loop",
                "output": str(job_dir / "slurm-%j.out"),
                "export": f"ALL,OUT={job_dir / 'out'}",
            },
            workdir=str(job_dir),
        )
    )


def running(ctl: SlurmControl, job_id: str) -> JobInfo | None:
    """The job when it is RUNNING on a node, else None (a probe for :func:`wait_for`)."""
    job = ctl.job(job_id)
    return job if job.state == "RUNNING" and job.nodes else None


def finished(ctl: SlurmControl, job_id: str) -> JobInfo | None:
    """The job once it reached a terminal state, else None (a probe for :func:`wait_for`)."""
    job = ctl.job(job_id)
    return job if job.finished else None


def down_node(ctl: SlurmControl, name: str) -> NodeInfo | None:
    """The node when it is DOWN, else None (a probe for :func:`wait_for`)."""
    node = ctl.node(name)
    return node if node.down else None


def expect_unsupported(request: pytest.FixtureRequest, ctl: object) -> None:
    """For a test marked ``writes("drain", ...)`` (the port methods it needs to change
    something): when ``ctl`` cannot perform one of them on this Slurm (its ``unsupported``),
    the test must fail with SlurmUnsupportedError and nothing else (a strict xfail: passing,
    or failing otherwise, fails it)."""
    marker = request.node.get_closest_marker("writes")
    missing = sorted(set(marker.args if marker else ()) & getattr(ctl, "unsupported", set()))
    if missing:
        request.applymarker(
            pytest.mark.xfail(
                raises=SlurmUnsupportedError,
                strict=True,
                reason=f"{type(ctl).__name__} cannot {', '.join(missing)} against this Slurm",
            )
        )


def output_lines(job_dir: Path, restarts: int) -> list[list[str]]:
    """Lines the loop job wrote during run number ``restarts`` (0 = first run)."""
    out = job_dir / "out"
    text = out.read_text() if out.exists() else ""
    return [ln.split() for ln in text.splitlines() if ln.split()[1] == str(restarts)]
