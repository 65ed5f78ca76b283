"""One ``recover demo`` per test session, shared by the tests that need an xid79 scenario run.

The demo is the xid79 scenario (shortened with ``--steps``) on its own local cluster, and
three tests would otherwise run that same scenario three times: the demo's own test, the
runbook (whose ``recover scenario run scenarios/shipped/xid79.yaml`` block is this run), and
the scenario matrix's run-directory checks. The run happens on first use, so a session that
selects none of them pays nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.helpers import require_local_slurm

#: Tests that read the demo run carry this mark, so that under pytest-xdist they share one
#: worker, whose session runs the demo once.
USES_DEMO = pytest.mark.xdist_group("demo")

#: Steps the demo trains (its default trains longer, for people watching).
DEMO_STEPS = 30


@dataclass(frozen=True)
class DemoRun:
    """The finished ``recover demo``: its process (exit status, stdout, stderr) and run dir."""

    done: subprocess.CompletedProcess[str]
    out: Path


@pytest.fixture(scope="session")
def demo_run(control_cache: Path) -> Iterator[DemoRun]:
    require_local_slurm()
    # Short on purpose: the scenario's cluster lives under the run directory, and slurmstepd's
    # socket paths there must stay under 108 characters (pytest's tmp paths are long).
    root = Path(tempfile.mkdtemp(prefix="demo-", dir="/tmp"))
    out = root / "xid79"
    done = subprocess.run(
        [sys.executable, "-m", "recovery", "demo", "--steps", str(DEMO_STEPS),
         "--out", str(out), "--cache", str(control_cache)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    yield DemoRun(done, out)
    shutil.rmtree(root, ignore_errors=True)
