"""A scenario's command job: placeholders checked and filled, and the Flax example's shipped
scenario (``examples/flax_lm/scenario.yaml``: XID 79 on its node) run for real on the local
Slurm cluster, its report written from the example's own event log, its final digest the
control run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scenarios import command_job
from scenarios.loader import ScenarioFileError, load_file, load_text
from tests.helpers import RECOVER
from tests.slurm.helpers import require_local_slurm

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "flax_lm" / "scenario.yaml"

BASE = """\
cluster: {nodes: 2, spares: 1}
faults: [{fault: xid79, node: job-node, via: kmsg, when: {step: 3}}]
"""


def test_placeholders_are_filled_and_scenario_dir_is_the_files_folder() -> None:
    job = load_file(SCENARIO).scenario.job
    assert job.command is not None
    argv = command_job.fill(job.command, run_dir=Path("/r"), steps=40, save_every=10, seed=0,
                            step_sleep=0.3)  # fmt: skip
    assert argv[:2] == [sys.executable, str(SCENARIO.parent / "train.py")]
    assert argv[2:] == ["--run-dir", "/r", "--steps", "40", "--save-every", "10", "--seed", "0",
                        "--step-delay", "0.3"]  # fmt: skip


def test_an_unknown_placeholder_is_refused_with_the_valid_ones() -> None:
    text = BASE + 'job: {command: ["{python}", "t.py", "{rundir}"], steps: 5, save_every: 1}\n'
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "s.yaml", default_name="s")
    assert "unknown placeholder {rundir}" in str(e.value)
    assert "{run_dir}" in str(e.value)


def test_literal_braces_and_an_empty_command() -> None:
    assert command_job.fill(["echo", "{{x}}"], run_dir=Path("/r"), steps=1, save_every=1,
                            seed=0, step_sleep=0) == ["echo", "{x}"]  # fmt: skip
    with pytest.raises(ScenarioFileError, match="at least one argument"):
        load_text(BASE + "job: {command: [], steps: 5, save_every: 1}\n", "s.yaml",
                  default_name="s")  # fmt: skip


@pytest.mark.slurm
@pytest.mark.slow
def test_the_flax_example_scenario_passes_on_real_slurm(
    control_cache: Path, tmp_path: Path
) -> None:
    require_local_slurm()
    out = tmp_path / "run"
    done = subprocess.run(
        [*RECOVER, "scenario", "run", str(SCENARIO), "--out", str(out), "--cache",
         str(control_cache), "--json", "--no-budgets"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    result = json.loads(done.stdout)
    assert result["passed"] is True, result
    doc = json.loads((out / "run.json").read_text())
    assert doc["job"]["model"] == "command"
    assert doc["final_digest"] == doc["control_digest"] is not None
    assert (out / "report.md").exists()
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("started") == 2  # killed once, then resumed
    assert any(e["event"] == "restored" for e in events)
