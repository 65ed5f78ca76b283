"""``recover checkpoint ls|verify|import-orbax``.

The checkpoint store (numpy, xxhash: the ``training`` extra) is imported inside the commands,
so that ``recover`` starts where only the agent or the coordinator is installed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from recover.options import AsJson
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
    from recovery.checkpoint import CheckpointStore

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
    from recovery.checkpoint import CheckpointStore

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


@app.command("import-orbax")
def import_orbax(
    source: Annotated[
        Path, typer.Argument(help="Orbax CheckpointManager directory or single save.")
    ],
    out: Annotated[Path, typer.Option(help="Checkpoint root to write (e.g. RUN_DIR/checkpoints).")],
    step: Annotated[
        int | None,
        typer.Option(help="Manager directory: import only this step. Single save: its step "
                     "number (default 0)."),
    ] = None,
    item: Annotated[
        str | None, typer.Option(help="Import only this item of a multi-item checkpoint.")
    ] = None,
    run_config: Annotated[
        str, typer.Option(help="Run configuration to store, as JSON (what you restore with).")
    ] = "{}",
) -> None:
    """Turn an Orbax checkpoint into verified checkpoints of ours (needs the orbax extra).

    Orbax itself reads the source; each step is written, then re-read and hashed. Exit 0: all
    imported and intact; 2: not an Orbax checkpoint, unknown step or item; 3: OUT already
    holds one of the steps.
    """
    from recovery.api.migrate import import_orbax as run_import

    try:
        config = json.loads(run_config)
    except json.JSONDecodeError as e:
        raise UsageError(f"--run-config is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise UsageError("--run-config must be a JSON object, e.g. '{\"seed\": 0}'")
    for done in run_import(source, out, step=step, item=item, run_config=config):
        typer.echo(
            f"step {done.step}: imported from {done.source} and verified ({done.leaves} "
            f"leaves, {_size(done.total_bytes)}, state_digest {done.state_digest})"
        )
