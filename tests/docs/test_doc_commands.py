"""The commands the README and docs/ show exist, with the options they show."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from recover import app
from tests.docs.doc_commands import ROOT, Cmd, DocCommand, all_commands, check, commands_in

COMMANDS = all_commands()


def _root() -> Cmd:
    return typer.main.get_command(app)


def test_docs_show_commands() -> None:
    # The extraction itself must find the docs' commands, or every check below passes vacuously.
    where = {c.path.name for c in COMMANDS}
    assert {"README.md", "coordinator.md", "runbook.md", "design.md"} <= where, where
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where() for c in COMMANDS])
def test_documented_command_matches_the_cli(cmd: DocCommand) -> None:
    problems = check(cmd, _root())
    assert not problems, f"{cmd.where()}: `{cmd.text}`: " + "; ".join(problems)


def test_the_check_catches_drift(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `recover incidents --open`.\n"
        "```\n"
        "recover cluster up [--nodes 4] | down | status [--json]\n"
        "recover coordinator serve --state-dir DIR\n"
        "                          [--no-such-flag]\n"
        "recover clusterr up\n"
        "recover breaker status | resett\n"
        "recover sbatch --nodes=3 -- recover train --bogus\n"
        "```\n"
    )
    found = list(commands_in(doc))
    assert [c.line for c in found] == [1, 3, 4, 6, 7, 8]
    results = [check(c, _root()) for c in found]
    assert results[0] == []
    assert results[1] == []
    assert "no option --no-such-flag" in results[2][0]
    assert "no sub-command 'clusterr'" in results[3][0]
    assert "'resett' is no sub-command" in results[4][0]
    # sbatch passes unknown options to Slurm, but the command after `--` is checked too.
    assert len(results[5]) == 1
    assert "--bogus" in results[5][0]


def test_root_is_the_repository() -> None:
    assert (ROOT / "pyproject.toml").is_file()
