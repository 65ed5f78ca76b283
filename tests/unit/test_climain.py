"""recovery.climain.run: how ``recover`` and ``python -m agents`` end, one way for both."""

from __future__ import annotations

import pytest
import typer

from recovery.climain import run
from recovery.errors import ClusterError, UsageError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def go(
    fail: str = "",
    code: int = 0,
) -> None:
    if fail == "usage":
        raise UsageError("Unknown node 'x'. Known: node1")
    if fail == "cluster":
        raise ClusterError("slurmctld exited during start")
    if fail == "abort":
        raise typer.Abort()
    if fail == "extra":
        raise ModuleNotFoundError("No module named 'jax'", name="jax")
    if fail == "other-module":
        raise ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours")
    if code:
        raise typer.Exit(code)
    typer.echo("ok")


def test_success_is_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(app, [], prog="recover") == 0
    assert capsys.readouterr().out == "ok\n"


@pytest.mark.parametrize(
    ("fail", "status", "message"),
    [
        ("usage", 2, "recover: error: Unknown node 'x'. Known: node1\n"),
        ("cluster", 6, "recover: error: slurmctld exited during start\n"),
        ("abort", 130, "recover: aborted\n"),
    ],
)
def test_an_error_is_one_message_and_its_status(
    capsys: pytest.CaptureFixture[str], fail: str, status: int, message: str
) -> None:
    assert run(app, ["--fail", fail], prog="recover") == status
    assert capsys.readouterr().err == message


def test_exit_keeps_its_code_and_the_prog_names_the_tool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(app, ["--code", "75"], prog="recover agent") == 75
    assert run(app, ["--fail", "usage"], prog="recover agent") == 2
    assert capsys.readouterr().err.startswith("recover agent: error: Unknown node")


def test_a_usage_error_shows_typer_s_usage_and_its_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(app, ["--no-such-option"], prog="recover") == 2
    err = capsys.readouterr().err
    assert "No such option: --no-such-option" in err
    assert "Usage:" in err


def test_a_missing_part_names_its_extra(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(app, ["--fail", "extra"], prog="recover") == 2
    err = capsys.readouterr().err
    assert "needs the Python package 'jax'" in err
    assert "pip install 'slurm-k8s-recover[training]'" in err


def test_another_missing_module_is_a_bug_and_raises() -> None:
    with pytest.raises(ModuleNotFoundError):
        run(app, ["--fail", "other-module"], prog="recover")
