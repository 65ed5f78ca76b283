"""``recover demo`` as a user runs it (shortened with ``--steps``): the xid79 scenario on a
4-node + 1-spare local cluster with the coordinator, an agent per node and a JAX training job,
ending with what the failure cost and where the timeline is.

The run is the session's one demo (``tests/plugins/demo_run.py``), which the runbook test and
the scenario matrix's xid79 checks read too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugins.demo_run import DemoRun

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_recover_demo_ends_with_the_cost_of_the_failure(demo_run: DemoRun) -> None:
    done, out = demo_run.done, demo_run.out
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "cluster up on Slurm 22.05" in text
    assert ": nodes node1, node2, node3, node4; spares spare1" in text
    assert "4 node(s), 4 process(es)" in text
    # The real failure: only the faulted node's training process dies, by SIGABRT.
    assert "on node1 SIGABRTed: its GPU is gone" in text
    assert "injected xid79 on node" in text
    assert "scenario xid79: PASSED" in text
    assert "ok   digest_matches_control" in text
    requeue = text.split("=== in-allocation ===", 1)[0]
    table = requeue.split("scenario xid79: PASSED", 1)[1]
    for phase in ("detection", "stall", "take_out", "requeue_wait", "replacement", "no_progress"):
        assert f"\n{phase} " in table, phase
    assert "lost progress: " in table
    assert "replacement: " in table
    assert "goodput" in table
    assert "(4 processes)" in table
    assert "fault -> training again = " in table
    report = json.loads((out / "report.json").read_text())
    assert len(report["ranks"]) == 4
    (inc,) = report["incidents"]
    # Every rank stopped after the fault, the killed one at it; the stall is their latest.
    assert all(t is not None and t >= inc["fault_at"] for t in inc["stopped"])
    assert inc["phases"]["stall"] == pytest.approx(max(inc["stopped"]) - inc["fault_at"])
    # Three of the four ranks stopped on losing their peer (exit 76), not killed by Slurm.
    lost = [json.loads(line) for r in (1, 2, 3)
            for line in (out / f"events.rank{r}.jsonl").read_text().splitlines()
            if '"peer-lost"' in line]  # fmt: skip
    assert len(lost) == 3, lost
    png = Path(table.rsplit("timeline: ", 1)[1].split()[0])
    assert png == out.absolute() / "timeline.png"
    assert png.stat().st_size > 0
    assert (out / "run.json").exists()


def test_recover_demo_then_recovers_inside_the_allocation_and_compares(demo_run: DemoRun) -> None:
    """The same fault with a spare node in the job: relaunched on it at once, restored from a
    survivor's memory, never requeued; then one table and one PNG of both modes."""
    done, out = demo_run.done, demo_run.out
    assert done.returncode == 0, done.stdout + done.stderr
    inalloc = done.stdout.split("=== in-allocation ===", 1)[1]
    assert "4 node(s) + 1 spare(s) in the job (in-allocation), 4 process(es)" in inalloc
    assert "scenario xid79: PASSED" in inalloc
    assert "ok   max_requeues" in inalloc
    assert "ok   incident_phases in-allocation" in inalloc
    sub = out / "in-allocation"
    report = json.loads((sub / "report.json").read_text())
    (inc,) = report["incidents"]
    assert inc["steps_recomputed"] <= 1
    restored = [json.loads(line) for line in (sub / "events.jsonl").read_text().splitlines()
                if '"restored"' in line]  # fmt: skip
    assert [e["source"] for e in restored] == ["memory"]
    # The side-by-side table: a column per mode, the nodes each job held.
    compare = inalloc.rsplit("side by side: ", 1)
    assert len(compare) == 2, inalloc[-2000:]
    rows = {line.split("  ")[0]: line.split()[-2:] for line in compare[0].splitlines()
            if line.startswith(("nodes the job held", "steps recomputed",
                                "final state = control"))}  # fmt: skip
    assert rows["nodes the job held"] == ["4", "5"]
    assert rows["final state = control"] == ["yes", "yes"]
    assert int(rows["steps recomputed"][1]) <= 1
    assert (out / "modes.md").read_text().startswith("# xid79: the recovery modes side by side")
    assert (out / "modes.png").stat().st_size > 0
