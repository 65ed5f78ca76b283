"""The site's progress thresholds, handed from the node's agent to what runs on the node
without a coordinator of its own (an in-allocation job's supervisor) through the progress
registry: written atomically, read back or absent, never mistaken for a process's entry, and
taken (or refused, with the defaults kept) by ``recover supervise-job``."""

from __future__ import annotations

from pathlib import Path

from agents.progress import ProgressSource
from recover.jobstep import site_budgets
from recovery.ports.clock import FakeClock
from recovery.progress.registry import (
    SITE_FILE,
    entries,
    read_site_budgets,
    register,
    write_site_budgets,
)


def test_written_read_back_and_not_an_entry(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    assert read_site_budgets(registry) is None
    assert write_site_budgets(registry, {"floor_s": 30, "straggler": {"factor": 2.0}})
    assert read_site_budgets(registry) == {"floor_s": 30, "straggler": {"factor": 2.0}}
    register(registry, tmp_path / "rank0.progress", node="n1", job="7", pid=4242)
    assert [e.pid for e in entries(registry)] == [4242]
    (registry / SITE_FILE).write_text("[1, 2]")
    assert read_site_budgets(registry) is None
    (registry / SITE_FILE).write_text("{torn")
    assert read_site_budgets(registry) is None
    (tmp_path / "file").write_text("")
    assert not write_site_budgets(tmp_path / "file" / "below", {"floor_s": 1})


def test_the_agent_leaves_the_thresholds_it_accepts_and_not_those_it_refuses(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "registry"
    write_site_budgets(registry, {"floor_s": 99})  # an earlier agent's, another site's
    source = ProgressSource("n1", FakeClock(), registry, log=lambda _line: None)
    source.use_site_budgets({})  # the first answer: no thresholds at this site
    assert read_site_budgets(registry) == {}
    source.use_site_budgets({"straggler": {"factor": 0.5}})  # refused: left as it was
    assert read_site_budgets(registry) == {}
    source.use_site_budgets({"floor_s": 45})
    assert read_site_budgets(registry) == {"floor_s": 45}


def test_the_supervisor_judges_by_the_sites_thresholds_over_the_defaults(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    budgets, said = site_budgets(registry)
    assert said == ""
    assert budgets.straggler.factor == 1.5
    write_site_budgets(registry, {})
    assert site_budgets(registry)[1] == ""
    write_site_budgets(registry, {"straggler": {"factor": 2.5}})
    budgets, said = site_budgets(registry)
    assert budgets.straggler.factor == 2.5
    assert said.startswith("taken: ")
    write_site_budgets(registry, {"straggler": {"factor": 0.5}})
    budgets, said = site_budgets(registry)
    assert budgets.straggler.factor == 1.5
    assert "refused" in said
    assert "factor must be > 1" in said
