"""The report's stacks mark: when the agents took a stalled job's stacks, read from the
files' header lines, whichever folder the run keeps them in."""

from __future__ import annotations

from pathlib import Path

from recovery.report.load import stacks_taken


def test_stacks_are_found_in_a_scenario_run_and_a_run_by_hand(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario" / "job" / "progress" / "stacks"
    by_hand = tmp_path / "hand" / "progress" / "stacks"
    for d in (scenario, by_hand):
        d.mkdir(parents=True)
    (scenario / "rank1.txt").write_text("rank 1 pid 9 on node2, step 10, phase steps, at 105.5\n")
    (scenario / "rank0.txt").write_text("rank 0 pid 8 on node1, step 10, phase steps, at 104.25\n")
    (scenario / "rank2.txt").write_text("garbled\n")  # skipped, not fatal
    (by_hand / "rank0.txt").write_text("rank 0 pid 7 on n, step 3, phase save, at 42\n")
    assert stacks_taken(tmp_path / "scenario") == (104.25, 105.5)
    assert stacks_taken(tmp_path / "hand") == (42.0,)
    assert stacks_taken(tmp_path / "nothing") == ()
