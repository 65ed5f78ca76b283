"""``recover checkpoint ls|verify``."""

from __future__ import annotations

import typer

app = typer.Typer(help="Inspect and verify checkpoints.", no_args_is_help=True)
