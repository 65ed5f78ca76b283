"""The ``recover`` command line. Thin: each command parses options and calls one function.

Heavy imports (jax, the Slurm adapter) happen inside the commands that need them so that
``recover --help`` and ``recover checkpoint ls`` stay fast.
"""

from __future__ import annotations

import sys

import typer

from agents import cli as _agent
from recovery.cli import checkpoint as _checkpoint
from recovery.cli import cluster as _cluster
from recovery.cli import coordinator as _coordinator
from recovery.cli import inject as _inject
from recovery.cli import ops as _ops
from recovery.cli import report as _report
from recovery.cli import scenario as _scenario
from recovery.cli import train as _train
from recovery.errors import RecoverError

app = typer.Typer(
    name="recover",
    help="Keep large training runs alive: verified checkpoints, resumable training, "
    "fault recovery on Slurm (and Kubernetes).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)
app.add_typer(_checkpoint.app, name="checkpoint")
app.add_typer(_cluster.app, name="cluster")
app.add_typer(_coordinator.app, name="coordinator")
app.add_typer(_coordinator.policy_app, name="policy")
app.add_typer(_agent.app, name="agent")
_train.register(app)
_cluster.register(app)
_ops.register(app)
_inject.register(app)
_report.register(app)
_scenario.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a :class:`RecoverError` becomes a one-paragraph message and its exit code."""
    try:
        # Without standalone mode, typer.Exit(n) comes back as the return value.
        rc = app(args=argv, standalone_mode=False)
    except RecoverError as e:
        print(f"recover: error: {e}", file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return int(e.exit_code)
    except typer.Abort:
        print("recover: aborted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # usage errors: unknown option, missing value, ...
        show = getattr(e, "show", None)
        if callable(show):
            show()
        else:
            print(f"recover: error: {e.format_message()}", file=sys.stderr)
        return int(e.exit_code)
    return rc if isinstance(rc, int) else 0
