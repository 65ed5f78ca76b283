"""`recover cluster ...` and `recover sbatch` through the real CLI entry point."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from recover import main
from recovery.statedir import Endpoint
from service import bringup
from slurm import procs
from slurm.cluster import REQUIRED_PROGRAMS, ClusterInfo
from tests.slurm.helpers import GOLDEN, TRAIN


@pytest.fixture(autouse=True)
def _no_inherited_slurm_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    # `recover cluster status` shows the cluster $SLURM_CONF names when one is set, and a
    # pyslurm test earlier in this worker process sets it for good (libslurm reads it once):
    # the lifecycle test then read another test's 3-node cluster.
    monkeypatch.delenv("SLURM_CONF", raising=False)


def test_sbatch_print_script_splits_sbatch_options_from_the_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert main(["sbatch", "--time=5", "-N", "1", "--print-script", "--", *TRAIN]) == 0
    assert capsys.readouterr().out == GOLDEN.read_text() + "\n"


def test_sbatch_finds_recover_where_the_job_will_not(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A shell without recover on PATH (it ran .venv/bin/recover): the job inherits that PATH
    and would fail at once (execve: No such file or directory). The script runs this
    installation's recover instead, for the step and its supervisor alike."""
    monkeypatch.setenv("PATH", str(tmp_path))
    own = Path(sys.executable).parent / "recover"
    assert own.is_file()
    assert main(["sbatch", "-N", "2", "--spares", "1", "--print-script", "--", *TRAIN]) == 0
    script = capsys.readouterr().out
    assert f"{own} supervise-job" in script
    assert f"-- {own} train" in script
    assert " recover train" not in script


@pytest.mark.parametrize(
    ("program", "says"),
    [
        ("trian.py", "'trian.py' is not on this shell's PATH"),
        ("./missing.sh", "./missing.sh is not an executable file"),
    ],
)
def test_sbatch_refuses_a_program_the_job_cannot_find(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    program: str, says: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["sbatch", "--print-script", "--", program, "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert "full path" in err or "give the program's path" in err


def test_a_relative_program_is_looked_for_where_the_job_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "job").mkdir()
    script = tmp_path / "job" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for chdir in (["--chdir=job"], ["-D", str(tmp_path / "job")]):
        assert main(["sbatch", *chdir, "--print-script", "--", "./run.sh"]) == 0
        assert "./run.sh &" in capsys.readouterr().out
    assert main(["sbatch", "--print-script", "--", "./run.sh"]) == 2
    assert f"looked for {tmp_path}/run.sh" in capsys.readouterr().err


def test_sbatch_without_a_command_says_how(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sbatch", "--print-script", "--time=5"]) == 2
    assert "give it after '--'" in capsys.readouterr().err


@pytest.mark.slurm
def test_cluster_lifecycle_is_idempotent(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    if any(shutil.which(p) is None for p in REQUIRED_PROGRAMS):
        pytest.skip("Slurm or munge not installed (apt-get install -y slurm-wlm munge)")
    # Not tmp_path: its folder is named after this test, too deep for slurmstepd's sockets.
    state = tmp_path_factory.mktemp("cli")
    opts = ["--state-dir", str(state)]
    try:
        assert main(["cluster", "up", "--nodes", "2", "--spares", "1", *opts]) == 0
        assert "cluster started: nodes node1, node2; spares spare1" in capsys.readouterr().out
        assert main(["cluster", "up", "--nodes", "2", "--spares", "1", *opts]) == 0
        assert "already running" in capsys.readouterr().out
        assert main(["cluster", "up", "--nodes", "3", *opts]) == 2
        assert "run `recover cluster down` first" in capsys.readouterr().err

        assert main(["cluster", "status", "--json", *opts]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["running"] is True
        states = {n["name"]: (n["state"], n["flags"], n["reason"]) for n in status["nodes"]}
        assert states == {
            "node1": ("IDLE", [], ""),
            "node2": ("IDLE", [], ""),
            "spare1": ("IDLE", ["DRAIN"], "recover: spare"),
        }
        assert main(["cluster", "env", *opts]) == 0
        assert capsys.readouterr().out == f"export SLURM_CONF={state / 'slurm.conf'}\n"
    finally:
        started = time.monotonic()
        assert main(["cluster", "down", *opts]) == 0
        assert time.monotonic() - started < 10
    assert "stopped: munged, slurmctld, slurmd:node1" in capsys.readouterr().out
    assert procs.cluster_processes(str(state)) == set()
    assert main(["cluster", "down", *opts]) == 0
    assert "no cluster was running" in capsys.readouterr().out


def test_cluster_up_and_down_are_the_local_bring_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The options become one LocalSpec for service.bringup.up, the scenario rig's bring-up.
    specs: list[tuple[Path, bringup.LocalSpec]] = []

    def up(state: Path, spec: bringup.LocalSpec) -> bringup.LocalUp:
        specs.append((state, spec))
        info = ClusterInfo(state, state / "slurm.conf", ("node1",), ("spare1",), {}, state)
        ep = Endpoint("http://127.0.0.1:8470", 1, bringup.coordinator_dir(state))
        return bringup.LocalUp(info, coordinator=ep)

    monkeypatch.setattr(bringup, "up", up)
    monkeypatch.setattr(bringup, "down", lambda state: [f"down {state.name}"])
    state = tmp_path / "slurm"
    argv = ["cluster", "up", "--nodes", "1", "--agents", "--rest", "--slurmd-timeout", "7"]
    assert main([*argv, "--state-dir", str(state), "--json"]) == 0
    assert specs == [
        (
            state,
            bringup.LocalSpec(
                nodes=1, spares=1, slurmd_timeout_s=7, rest=True, coordinator=False, agents=True
            ),
        )
    ]
    doc = json.loads(capsys.readouterr().out)
    assert doc["coordinator"] == {
        "url": "http://127.0.0.1:8470",
        "state_dir": str(tmp_path / "coordinator"),
    }
    assert main(["cluster", "down", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out == "stopped: down slurm\n"
