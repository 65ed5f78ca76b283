"""``recover train``: the JAX training entrypoint."""

from __future__ import annotations

import typer


def register(root: typer.Typer) -> None:
    """Attach ``recover train`` to the root command."""
