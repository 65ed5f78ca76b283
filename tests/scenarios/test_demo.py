"""``recover demo`` as a user runs it (shortened with ``--steps``): the xid79 scenario on a
4-node + 1-spare local cluster with the coordinator, an agent per node and a JAX training job,
ending with what the failure cost and where the timeline is.

The run is the session's one demo (``tests/plugins/demo_run.py``), which the runbook test and
the scenario matrix's xid79 checks read too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.demo_run import DemoRun

pytestmark = pytest.mark.slurm


def test_recover_demo_ends_with_the_cost_of_the_failure(demo_run: DemoRun) -> None:
    done, out = demo_run.done, demo_run.out
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "cluster up on Slurm 22.05" in text
    assert ": nodes node1, node2, node3, node4; spares spare1" in text
    assert "injected xid79 on node" in text
    assert "scenario xid79: PASSED" in text
    assert "ok   digest_matches_control" in text
    table = text.split("scenario xid79: PASSED", 1)[1]
    for phase in ("detection", "take_out", "requeue_wait", "replacement", "no_progress"):
        assert f"\n{phase} " in table, phase
    assert "lost progress: " in table
    assert "replacement: " in table
    assert "goodput" in table
    png = Path(table.rsplit("timeline: ", 1)[1].split()[0])
    assert png == out.absolute() / "timeline.png"
    assert png.stat().st_size > 0
    assert (out / "run.json").exists()
