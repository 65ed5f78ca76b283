"""docs/coordinator.md stays true: its policy file example loads, its commands exist, it
lists the reconcile steps and the journal's phases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recover import app
from recovery.policy import PolicyConfig, load_catalogue, load_policy_config
from recovery.ports.journal import PhaseName
from tests.fakes.slurm import FakeSlurm

from .helpers import Rig

DOC = Path(__file__).resolve().parents[3] / "docs" / "coordinator.md"


def test_the_policy_file_example_loads(tmp_path: Path) -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    path = tmp_path / "policy.yaml"
    path.write_text(block)
    config = load_policy_config(path, catalogue=load_catalogue())
    assert config != PolicyConfig.default()
    assert config.breaker.max_nodes == 10


@pytest.mark.slow
def test_every_command_in_the_synopsis_has_help() -> None:
    synopsis = re.search(r"```\n(recover coordinator serve.*?)```", DOC.read_text(), re.S)
    assert synopsis is not None
    runner = CliRunner()
    for line in synopsis.group(1).splitlines():
        if not line.startswith("recover "):
            continue
        words = [w for w in line.split("#")[0].split()[1:] if re.fullmatch(r"[a-z]+", w)]
        # "breaker status | reset": both verbs
        verbs = words[:2] if words[:1] in (["coordinator"], ["cluster"], ["node"], ["policy"],
                                           ["breaker"]) else words[:1]  # fmt: skip
        result = runner.invoke(app, [*verbs, "--help"])
        assert result.exit_code == 0, (line, result.output)


def test_the_reconcile_steps_are_listed_in_their_order(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", FakeSlurm(["n1"]))
    table = DOC.read_text().split("| step | what it does |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^   \| `([a-z-]+)` \|", table, re.M)
    assert tuple(listed) == rig.engine.reconcile_steps


def test_every_journal_phase_is_named() -> None:
    text = DOC.read_text()
    assert [p.value for p in PhaseName if f"`{p.value}`" not in text] == []
