"""docs/runbook.md, run as written: its ``sh`` blocks, top to bottom, in one bash shell.

One line is not run here but taken from the session's ``recover demo``: the runbook's
``recover scenario run scenarios/shipped/xid79.yaml --out runs/xid79`` is the xid79 scenario
the demo runs (shortened), so its run directory is copied to ``runs/xid79`` instead of running
the same scenario a second time; the blocks after it (``recover report runs/xid79``, ...) read
it as they would their own. The line must appear exactly as written, or the test fails.

Runs in a scratch directory (``scenarios/`` linked in, so the runbook's relative paths work)
against real daemons: the scenario's own local cluster, then the runbook's. Between blocks the
test records ``recover status --json`` where the runbook makes a claim about it, and checks
those claims afterwards. Whatever the script leaves running is stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docs.doc_commands import ROOT
from tests.plugins.demo_run import DemoRun

RUNBOOK = ROOT / "docs" / "runbook.md"
BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs as root"),
    pytest.mark.skipif(
        shutil.which("slurmctld", path="/usr/sbin") is None, reason="needs slurm-wlm"
    ),
]


def sh_blocks(text: str) -> list[str]:
    """The bodies of the ```sh fenced blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)


#: The runbook's scenario run, which the session's demo run stands for (see the docstring).
SCENARIO_LINE = "recover scenario run scenarios/shipped/xid79.yaml --out runs/xid79"


def _script(blocks: list[str], out: Path, demo_out: Path) -> str:
    lines = ["set -euo pipefail"]
    for i, block in enumerate(blocks):
        for line in block.splitlines():
            if line.strip() == SCENARIO_LINE:
                lines.append(f"mkdir -p runs && cp -a {demo_out} runs/xid79")
                continue
            if line.strip() == "recover cluster down":
                lines.append(f"recover status --json > {out}/status-before-down.json")
            lines.append(line)
            if line.startswith("recover inject "):
                lines.append(f"recover status --json > {out}/status-after-inject.json")
        lines.append(f"echo '::block {i} done'")
    return "\n".join(lines) + "\n"


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Short on purpose: slurmstepd's socket paths under the cluster's state dir must stay
    # under 108 characters, and pytest's tmp_path is long.
    tmp_path = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    yield tmp_path
    # Leave nothing behind, whatever the script reached.
    env = {**os.environ, "RECOVER_STATE_DIR": str(tmp_path / ".state" / "runbook")}
    subprocess.run(
        [BIN / "recover", "cluster", "down"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )


def _node(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in status["nodes"] if n["name"] == name)


def test_sh_blocks_are_found() -> None:
    blocks = sh_blocks(RUNBOOK.read_text())
    assert len(blocks) >= 5
    assert any("recover inject" in b for b in blocks)
    scenario_lines = [ln for b in blocks for ln in b.splitlines() if ln.strip() == SCENARIO_LINE]
    assert len(scenario_lines) == 1, f"the runbook should run {SCENARIO_LINE!r} once"


@pytest.mark.slow
def test_runbook_runs_as_written(scratch: Path, demo_run: DemoRun) -> None:
    assert demo_run.done.returncode == 0, "the demo run the runbook reads failed:\n" + (
        demo_run.done.stdout[-3000:] + demo_run.done.stderr[-3000:]
    )
    blocks = sh_blocks(RUNBOOK.read_text())
    out = scratch / "captured"
    out.mkdir()
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("RECOVER_STATE_DIR", None)
    env.pop("SLURM_CONF", None)
    proc = subprocess.run(
        ["bash", "-c", _script(blocks, out, demo_run.out)],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"runbook failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert f"::block {len(blocks) - 1} done" in proc.stdout

    after_inject = json.loads((out / "status-after-inject.json").read_text())
    node1 = _node(after_inject, "node1")
    assert node1["state"].startswith("DOWN"), f"{node1}\n{proc.stdout[-6000:]}"
    assert node1["held_by"] == "recover", node1
    assert node1["reason"].startswith("recover: xid79"), node1
    assert not _node(after_inject, "spare1")["spare"], "the spare was not promoted"

    before_down = json.loads((out / "status-before-down.json").read_text())
    assert _node(before_down, "node1")["spare"], "the repaired node did not return to the pool"

    scenario_out = scratch / "runs" / "xid79"
    for name in (
        "run.json",
        "incidents.json",
        "events.jsonl",
        "report.json",
        "report.md",
        "timeline.png",
    ):
        assert (scenario_out / name).is_file(), name
