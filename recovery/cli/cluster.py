"""``recover cluster ...`` and ``recover sbatch``: the local Slurm cluster and job submission.

Placeholder until the Slurm work lands; the commands are wired by ``register``.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="Start, inspect and stop a real local Slurm cluster.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    """Attach top-level commands that belong to the Slurm side (``recover sbatch``)."""
