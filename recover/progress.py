"""``recover progress RUN_DIR``: what a job's processes report about their progress, and the
watcher's verdict on it (progressing, stalled and who holds it up, or not watched)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from recover.options import AsJson
from recovery.errors import UsageError
from recovery.progress import Budgets, Record, StallWatch, Verdict, read_records


def _directory(run_dir: Path) -> Path:
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory")
    sub = run_dir / "progress"
    return sub if sub.is_dir() else run_dir


def _row(rec: Record, now: float) -> str:
    idle = now - max(rec.step_finished_at, rec.phase_since)
    per_step = f"{rec.last_step_s:.3f}s/step" if rec.last_step_s else "-"
    return (
        f"rank {rec.rank:<3} {rec.node or '?':<12} pid {rec.pid:<8} {rec.phase.name:<10} "
        f"step {rec.step_finished:<7} {per_step:<14} idle {idle:6.1f}s  "
        f"alive {now - rec.alive_at:5.1f}s ago"
    )


def _verdict_line(v: Verdict) -> str:
    if v.state != "stalled":
        extra = ""
        if v.state == "running":
            extra = f" (step {v.step}, idle {v.idle_s:.1f}s of {v.budget_s:g}s)"
        return f"{v.state}: {v.why}{extra}"
    sure = "" if v.confident else " [not attributed]"
    return f"stalled for {v.idle_s:.1f}s (budget {v.budget_s:g}s): {v.why}{sure}"


def progress(
    run_dir: Annotated[
        Path,
        typer.Argument(help="The run directory (its progress/ folder) or a progress folder."),
    ],
    look_for: Annotated[
        float,
        typer.Option(
            "--look-for",
            help="Look every second for this many seconds, learning the job's time per step "
            "as the watcher does, and print each change of verdict (0: one look, judged "
            "with the budget for a job not yet learned).",
        ),
    ] = 0.0,
    floor: Annotated[
        float, typer.Option("--floor", help="Seconds a step loop may always go without a step.")
    ] = Budgets.floor_s,
    factor: Annotated[
        float,
        typer.Option("--factor", help="... or this many times its recent p99 time per step."),
    ] = Budgets.factor,
    as_json: AsJson = False,
) -> None:
    """Each process's progress record (phase, last finished step, time per step, how long
    since it progressed and since it last ran) and the watcher's verdict: running, stalled
    (with the process that holds the others up, when it can be told), done, or unwatched
    (the loop reports nothing: it is never judged)."""
    if look_for < 0:
        raise UsageError(f"--look-for must be >= 0 seconds (got {look_for:g})")
    directory = _directory(run_dir)
    watch = StallWatch(Budgets(floor_s=floor, factor=factor))
    end = time.monotonic() + look_for
    last = None
    while True:
        records = read_records(directory)
        now = time.time()
        verdict = watch.observe(records, now)
        line = _verdict_line(verdict)
        if not as_json and (last is None or verdict.state != last):
            if last is None:
                for rec in records.values():
                    typer.echo(_row(rec, now))
            typer.echo(line)
        last = verdict.state
        if time.monotonic() >= end:
            break
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "records": [
                        {**dataclasses.asdict(r), "phase": r.phase.name} for r in records.values()
                    ],
                    "verdict": {**dataclasses.asdict(verdict), "line": line},
                },
                indent=2,
            )
        )


def register(app: typer.Typer) -> None:
    """Add ``recover progress`` to ``app``."""
    app.command("progress")(progress)
