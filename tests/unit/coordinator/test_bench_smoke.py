"""The decision benchmark at a tiny size, so that it keeps running as the engine changes.
Nothing here is timed: it checks that every event is decided and acted on as the policy says."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks.decision_bench import report, run, targets
from benchmarks.decision_rig import Options


def test_bench_runs_a_small_storm_under_both_policies(tmp_path: Path) -> None:
    opts = Options(
        nodes=40, storms=(12,), read_s=0.0, update_s=0.0, spares=4, spread_s=0.05, deadline_s=10
    )
    raised, default = run(opts, tmp_path)
    for r in (raised, default):
        assert r.finished
        assert r.decided == 12
        assert r.decision["count"] == 12
        assert r.all_decided_s is not None
    assert raised.takedown["count"] == 12
    assert raised.held["count"] == 0
    assert raised.promoted == 4  # the pool had four spares
    # The default breaker takes out at most 10 nodes per window and holds the rest.
    assert default.takedown["count"] == 10
    assert default.held["count"] == 2
    text = report([raised, default], opts)
    assert "storm 12, raised" in text
    assert "NVSentinel" in text
    assert len(targets([raised, default])) == 4
    json.dumps([asdict(raised), asdict(default)])  # what --json writes


@pytest.mark.slow
def test_bench_runs_a_small_storm_through_the_http_intake(tmp_path: Path) -> None:
    opts = Options(
        nodes=20,
        storms=(5,),
        policies=("raised",),
        read_s=0.0,
        update_s=0.0,
        spares=2,
        spread_s=0.05,
        deadline_s=30,
        http=True,
    )
    (r,) = run(opts, tmp_path)
    assert r.finished
    assert r.path == "http"
    assert r.takedown["count"] == 5
    assert r.intake is not None
    assert r.intake["count"] == 5
    assert r.from_send is not None
    assert r.from_send["decision"]["count"] == 5
    assert r.slurm_updates >= 1  # counted in the server process and handed back
