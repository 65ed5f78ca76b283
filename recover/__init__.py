"""The ``recover`` command line. Thin: each command parses options and calls one function.

One module per group of commands beside this one (``recover agent`` is :mod:`agents.cli`);
options several commands share are in :mod:`recover.options`; :func:`main` turns errors
into exit statuses (:mod:`recovery.climain`). Heavy imports (jax, the Slurm adapter) happen
inside the commands that need them so that ``recover --help`` and ``recover checkpoint ls``
stay fast.
"""

from __future__ import annotations

import typer

from agents import cli as _agent
from recover import checkpoint as _checkpoint
from recover import cluster as _cluster
from recover import coordinator as _coordinator
from recover import inject as _inject
from recover import jobstep as _jobstep
from recover import ops as _ops
from recover import progress as _progress
from recover import report as _report
from recover import scenario as _scenario
from recover import train as _train
from recovery import climain

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
_progress.register(app)
_scenario.register(app)
_jobstep.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a :class:`RecoverError` becomes a one-paragraph message and its exit code
    (:func:`recovery.climain.run`)."""
    return climain.run(app, argv, prog="recover")
