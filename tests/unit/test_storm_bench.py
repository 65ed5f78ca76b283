"""``benchmarks.storm_bench``'s options and its side-by-side table (pure: the storms
themselves run in tests/coordinator/test_storm.py and the benchmark)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.storm_bench import parse, side_by_side
from benchmarks.storm_read import summary
from benchmarks.storm_rig import StormResult


def _run(backend: str, downs: list[float], up_s: float = 4.0, mb: float = 900.0) -> StormResult:
    return StormResult(
        options={"backend": backend}, faulted=[], via_agent=[], fault_to_down=summary(downs),
        down_s=sorted(downs), receipt_to_takedown={}, post_answered={}, promoted={},
        not_down=[], problems=[], stages={}, updates=None, slurm="slurm 25.11.7", up_s=up_s,
        jobs_s=1.0, memory_mb=mb, load=(0.0, 0.0, 0.0),
    )  # fmt: skip


def test_backends_repeat_and_the_slurm_choice_is_checked(capsys: Any) -> None:
    opts, args = parse(["--backend", "cli", "--backend", "rest", "--backend", "cli"])
    assert args.backend == ["cli", "rest"]  # each once, in the order given
    assert opts.backend == "cli"
    _, plain = parse([])
    assert plain.backend == ["cli"]
    with pytest.raises(SystemExit):
        parse(["--slurm", "24.05"])
    assert "Unknown Slurm version" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--backend", "grpc"])


def test_side_by_side_pools_every_run_of_a_backend() -> None:
    table = side_by_side({
        "cli": [_run("cli", [0.1, 0.2]), _run("cli", [0.3], up_s=6.0, mb=950)],
        "rest": [_run("rest", [1.0, 2.0, 3.0])],
        "pyslurm": [],
    })  # fmt: skip
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert rows["cli"][:6] == ["cli", "2", "3", "0.20", "0.30", "0.30"]
    assert rows["cli"][-2:] == ["6.0", "950"]  # the slower start, the larger footprint
    assert rows["rest"][:6] == ["rest", "1", "3", "2.00", "3.00", "3.00"]
    assert "did not run" in " ".join(rows["pyslurm"])
