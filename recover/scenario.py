"""``recover scenario run|list`` and ``recover demo``: fault scenarios against a test cluster.

Thin: each command parses its options and calls one function of :mod:`scenarios.main`, which
is imported inside the command (it pulls in the Slurm adapter and the runner), so ``recover
--help`` stays fast. Exit status 10: the scenario ran but an expectation failed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from recover.options import AsJson, SlurmBackend, SlurmVersion

app = typer.Typer(
    help="Run fault scenarios against a test cluster and check what they cost.",
    no_args_is_help=True,
)

Out = Annotated[
    Path | None,
    typer.Option(help="Run directory to write [default: runs/NAME-YYYYmmdd-HHMMSS]."),
]
Cache = Annotated[
    Path | None,
    typer.Option(
        help="Where control runs are cached [default: $RECOVER_STATE_DIR/control-runs "
        "or ./.state/control-runs]."
    ),
]


@app.command("run")
def run(
    scenario: Annotated[str, typer.Argument(help="A scenario file, or a shipped scenario's name.")],
    out: Out = None,
    cache: Cache = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as JSON (progress on stderr).")
    ] = False,
    no_budgets: Annotated[
        bool,
        typer.Option("--no-budgets", help="Report phase budgets without failing on them."),
    ] = False,
    slurm_conf: Annotated[
        str | None,
        typer.Option(help="Run on this existing cluster's slurm.conf instead of a local one."),
    ] = None,
    coordinator: Annotated[
        str | None, typer.Option(help="The existing cluster's coordinator URL.")
    ] = None,
    token_file: Annotated[
        str | None, typer.Option(help="The existing coordinator's tokens file.")
    ] = None,
    slurm_backend: SlurmBackend = None,
    slurm: SlurmVersion = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help="How the job comes back from a lost node, whatever the file says: requeue "
            "(the coordinator requeues it) or in-allocation (the job holds a spare node and "
            "relaunches on it; the local cluster gets one more node so the job trains on as "
            "many). The file's expect_in_allocation applies in-allocation."
        ),
    ] = None,
) -> None:
    """Run a scenario: start the local cluster (or use an existing one), inject its faults,
    check its expectations, write its run directory and report. --slurm-backend is how the
    runner submits the job and reads Slurm (rest: the local cluster also starts slurmrestd);
    the coordinator it starts uses Slurm's commands."""
    from scenarios.main import existing_from, run_command
    from service.wiring import SlurmAccess

    raise typer.Exit(
        run_command(
            scenario, out=out, cache=cache, as_json=as_json, enforce_budgets=not no_budgets,
            existing=existing_from(slurm_conf, coordinator, token_file), env=os.environ,
            slurm=SlurmAccess(slurm_backend, slurm=slurm), mode=mode,
        )
    )  # fmt: skip


@app.command("list")
def list_(as_json: AsJson = False) -> None:
    """Show the shipped scenarios (name, what it does)."""
    from scenarios.main import list_command

    raise typer.Exit(list_command(as_json=as_json))


def demo(
    steps: Annotated[
        int | None, typer.Option(help="Final training step [default: the scenario's].")
    ] = None,
    out: Out = None,
    cache: Cache = None,
    mode: Annotated[
        str,
        typer.Option(
            help="both: requeued (OUT), then in-allocation with a spare node in the job "
            "(OUT/in-allocation), then one table and one PNG of both (OUT/modes.md, "
            "OUT/modes.png); requeue or in-allocation: that one only."
        ),
    ] = "both",
) -> None:
    """XID 79 on a 4-node + 1-spare local cluster with the coordinator, an agent per node and
    a real JAX training job, recovered by a requeue and then inside the job's allocation;
    ends with what the failure cost in each, phase by phase, side by side."""
    from scenarios.main import demo_command

    raise typer.Exit(demo_command(steps=steps, out=out, cache=cache, env=os.environ, mode=mode))


def register(root: typer.Typer) -> None:
    """Attach ``recover scenario ...`` and ``recover demo``."""
    root.add_typer(app, name="scenario")
    root.command("demo")(demo)
