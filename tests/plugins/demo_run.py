"""One ``recover demo`` per test session, shared by the tests that need an xid79 scenario run.

The demo is the xid79 scenario (shortened with ``--steps``) on its own local cluster, and
three tests would otherwise run that same scenario three times: the demo's own test, the
runbook (whose ``recover scenario run scenarios/shipped/xid79.yaml`` block is this run), and
the scenario matrix's run-directory checks. The run happens on first use, so a session that
selects none of them pays nothing.

Under pytest-xdist those tests may land on different workers: the first to ask runs the demo
under a file lock in a folder of the whole session (named after the controlling pytest
process), and the others wait for it and read the same run. The controlling process removes
the folder when the session ends.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.helpers import require_local_slurm

#: Steps the demo trains (its default trains longer, for people watching).
DEMO_STEPS = 40


@dataclass(frozen=True)
class DemoRun:
    """The finished ``recover demo``: its process (exit status, stdout, stderr) and run dir."""

    done: subprocess.CompletedProcess[str]
    out: Path


def session_root() -> Path:
    """The folder of this test session's demo run, the same in every xdist worker.

    Short on purpose: the scenario's cluster lives under the run directory, and slurmstepd's
    socket paths there must stay under 108 characters (pytest's tmp paths are long)."""
    controller = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    return Path(f"/tmp/recover-demo-{controller}")


@pytest.fixture(scope="session")
def demo_run(control_cache: Path) -> DemoRun:
    require_local_slurm()
    root = session_root()
    root.mkdir(exist_ok=True)
    out, result = root / "xid79", root / "result.json"
    with (root / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while the first worker runs the demo
        if not result.exists():
            done = subprocess.run(
                [sys.executable, "-m", "recover", "demo", "--steps", str(DEMO_STEPS),
                 "--out", str(out), "--cache", str(control_cache)],
                capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            doc = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            result.write_text(json.dumps(doc))
        doc = json.loads(result.read_text())
    return DemoRun(
        subprocess.CompletedProcess(
            [], doc["returncode"], stdout=doc["stdout"], stderr=doc["stderr"]
        ),
        out,
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the workers are done by now
        shutil.rmtree(session_root(), ignore_errors=True)
