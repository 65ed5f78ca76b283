"""`recover cluster ...` and `recover sbatch` through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from recovery.cli import main
from slurm import procs
from slurm.cluster import REQUIRED_PROGRAMS
from tests.slurm.helpers import GOLDEN, TRAIN


def test_sbatch_print_script_splits_sbatch_options_from_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sbatch", "--time=5", "-N", "1", "--print-script", "--", *TRAIN]) == 0
    assert capsys.readouterr().out == GOLDEN.read_text() + "\n"


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
