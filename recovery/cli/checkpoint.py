"""``recover checkpoint ls|verify``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from recovery.checkpoint import CheckpointStore
from recovery.cli.options import AsJson
from recovery.errors import CheckpointDamaged, NoCheckpointError, UsageError

app = typer.Typer(help="Inspect and verify checkpoints.", no_args_is_help=True)


def _root(directory: Path) -> Path:
    """Accept a run directory (with checkpoints/) or a checkpoint root itself."""
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    sub = directory / "checkpoints"
    return sub if sub.is_dir() else directory


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


@app.command("ls")
def ls(
    directory: Annotated[Path, typer.Argument(help="Run directory or checkpoint root.")],
    quick: Annotated[
        bool, typer.Option("--quick", help="Check manifests and sizes only, not every byte.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """List checkpoints, newest first: intact / incomplete / corrupt with the reason."""
    statuses = CheckpointStore(_root(directory)).scan(deep=not quick)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(s) for s in statuses], indent=2))
        return
    if not statuses:
        typer.echo(f"no checkpoints in {_root(directory)}")
        return
    typer.echo(f"{'STEP':>8}  {'STATE':<10}  {'SIZE':>10}  {'AGE':>5}  NAME / REASON")
    for s in statuses:
        step = "-" if s.step is None else str(s.step)
        line = f"{step:>8}  {s.state:<10}  {_size(s.size_bytes):>10}  {_age(s.age_s):>5}  {s.name}"
        typer.echo(line + (f": {s.reason}" if s.reason else ""))


@app.command("verify")
def verify(
    directory: Annotated[Path, typer.Argument(help="Run directory or checkpoint root.")],
    step: Annotated[
        int | None, typer.Option(help="Step to verify; default: every checkpoint.")
    ] = None,
) -> None:
    """Re-read and hash every file; exit 0 only if every verified step is intact."""
    store = CheckpointStore(_root(directory))
    steps = store.steps()
    if not steps:
        raise NoCheckpointError(f"no checkpoints in {store.root}")
    if step is not None and step not in steps:
        known = ", ".join(str(s) for s in steps)
        raise UsageError(f"Unknown step {step} in {store.root}. Known: {known}")
    failed = 0
    for s in [step] if step is not None else list(reversed(steps)):
        try:
            manifest = store.verify(s)
        except CheckpointDamaged as e:
            failed += 1
            typer.echo(f"step {s}: DAMAGED: {e.reason}")
            continue
        typer.echo(
            f"step {s}: intact ({len(manifest.leaves)} leaves, {_size(manifest.total_bytes)})"
        )
    if failed:
        raise typer.Exit(3)
