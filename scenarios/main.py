"""What the ``recover scenario ...`` and ``recover demo`` commands do, one function each, so
the typer commands in :mod:`recover.scenario` only parse options.

Each returns the process exit status: 0 when every expectation held,
:data:`scenarios.runner.EXPECTATION_FAILED` (10) when one failed; errors that stop a run from
starting are raised (a RecoverError with its own exit status).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from recovery.contract.exits import signal_status
from recovery.errors import RecoverError, UsageError, unknown_choice
from recovery.fsutil import atomic_write
from scenarios import loader, render
from scenarios.loader import Loaded
from scenarios.runner import EXPECTATION_FAILED, RunOptions, RunResult, run
from scenarios.schema import MODES, ExistingCluster
from service.wiring import SlurmAccess

#: The shipped scenario ``recover demo`` runs.
DEMO = "xid79"


def state_base(env: Mapping[str, str]) -> Path:
    """``$RECOVER_STATE_DIR`` or ``./.state`` (absolute)."""
    return Path(env.get("RECOVER_STATE_DIR") or ".state").absolute()


def default_out(name: str, clock: float | None = None) -> Path:
    """``runs/NAME-YYYYmmdd-HHMMSS`` under the current directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock))
    return Path("runs") / f"{name}-{stamp}"


def existing_from(
    slurm_conf: str | None, coordinator: str | None, token_file: str | None
) -> ExistingCluster | None:
    """The existing cluster the command line names, or None to follow the file."""
    if slurm_conf is None and coordinator is None and token_file is None:
        return None
    return ExistingCluster(slurm_conf=slurm_conf, coordinator=coordinator, token_file=token_file)


def run_command(
    scenario: str,
    *,
    out: Path | None,
    cache: Path | None,
    as_json: bool,
    enforce_budgets: bool = True,
    existing: ExistingCluster | None = None,
    env: Mapping[str, str] = os.environ,
    slurm: SlurmAccess | None = None,
    mode: str | None = None,
) -> int:
    """``recover scenario run``: progress on stdout (stderr with ``--json``, whose result
    document goes to stdout), the result, and the failed expectations on stderr. ``slurm``:
    how the runner reaches Slurm (``--slurm-backend``); ``mode``: the job's recovery mode
    whatever the file says (``--mode``)."""
    loaded = loader.with_mode(loader.find(scenario), mode)
    result = _run(loaded, out, cache, as_json, enforce_budgets, existing, env, slurm)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(render.result_text(result))
    if not result.passed:
        print(f"recover: {render.failure_text(result)}", file=sys.stderr)
        return EXPECTATION_FAILED
    return 0


def list_command(*, as_json: bool) -> int:
    """``recover scenario list``: the shipped scenarios' names and descriptions."""
    found = loader.shipped()
    if as_json:
        doc = [
            {"name": x.scenario.name, "description": x.scenario.description, "file": str(x.path)}
            for x in found
        ]
        print(json.dumps(doc, indent=2))
    else:
        print(render.list_text(found))
    return 0


#: ``recover demo --mode``: one recovery mode, or both side by side.
DEMO_MODES = ("both", *MODES)
#: Where ``recover demo --mode both`` writes the in-allocation run, inside its run directory.
IN_ALLOCATION_DIR = "in-allocation"
MODES_MD, MODES_PNG = "modes.md", "modes.png"


def demo_command(
    *,
    steps: int | None,
    out: Path | None,
    cache: Path | None,
    env: Mapping[str, str] = os.environ,
    mode: str = "both",
) -> int:
    """``recover demo``: the xid79 scenario on a local cluster, then the report's table (each
    phase, lost progress against replacement time, goodput) ending with the timeline's path.

    ``mode`` ``both`` (the default) runs it requeued (4 nodes + 1 pool spare; its run
    directory is OUT) and then in-allocation (the job holds a fifth node; OUT/in-allocation),
    and ends with one table of both and one PNG of both timelines (OUT/modes.md,
    OUT/modes.png). ``steps`` shortens (or lengthens) the training; it must leave the fault
    inside the run.
    """
    if mode not in DEMO_MODES:
        raise unknown_choice("demo mode (--mode)", mode, DEMO_MODES)
    loaded = loader.find(DEMO)
    if steps is not None:
        loaded = with_steps(loaded, steps)
    modes = MODES if mode == "both" else (mode,)
    base = out or default_out(loaded.scenario.name)
    if mode == "both" and base.exists() and any(base.iterdir()):
        raise UsageError(f"{base} exists and is not empty; choose another --out or remove it")
    print(f"recover demo: {loaded.scenario.description}")
    results = []
    for i, m in enumerate(modes):
        run_out = base / IN_ALLOCATION_DIR if i else base
        if len(modes) > 1:
            print(f"\n=== {m} ===")
        results.append(_run(loader.with_mode(loaded, m), run_out, cache, False, True, None, env))
        print()
        print(render.result_text(results[-1]))
        print()
        report = results[-1].report
        print(report.table if report is not None else "no report: see the notes in run.json")
    if len(modes) > 1:
        print()
        print(_compare(base, list(zip(modes, results, strict=True)), loaded))
    return 0 if all(r.passed for r in results) else EXPECTATION_FAILED


def _compare(base: Path, runs: list[tuple[str, RunResult]], loaded: Loaded) -> str:
    """The modes' table and timelines, written to ``base``; the text printed."""
    from recovery.report import build_report, load_run
    from recovery.report.table import render_modes
    from service.reportgen.timeline import render_modes_png

    try:
        reports = [(m, build_report(load_run(r.out))) for m, r in runs]
    except RecoverError as e:
        return f"no side-by-side table: {e}"
    # The nodes Slurm gave the job at its start: in-allocation, its spares too.
    text = render_modes([(m, rep, len(rep.job.nodes)) for m, rep in reports])
    atomic_write(base / MODES_PNG, render_modes_png(reports))
    md = f"# {loaded.scenario.name}: the recovery modes side by side\n\n```\n{text}\n```\n\n"
    atomic_write(base / MODES_MD, (md + f"![timelines]({MODES_PNG})\n").encode())
    return f"{text}\n\nside by side: {base / MODES_MD}, timelines: {base / MODES_PNG}"


def with_steps(loaded: Loaded, steps: int) -> Loaded:
    """``loaded`` with the job's final step set to ``steps``. Raises UsageError when the
    run would end before a step or checkpoint trigger of its faults."""
    s = loaded.scenario
    triggers = [e.when.trigger for e in s.faults]
    needed = max((int(str(v)) for k, v in triggers if k in ("step", "checkpoint")), default=0)
    if steps <= needed:
        raise UsageError(f"--steps {steps}: the fault comes at step {needed}; give more than that")
    job = s.job.model_copy(update={"steps": steps})
    return Loaded(s.model_copy(update={"job": job}), loaded.text, loaded.path)


def _run(
    loaded: Loaded,
    out: Path | None,
    cache: Path | None,
    as_json: bool,
    enforce_budgets: bool,
    existing: ExistingCluster | None,
    env: Mapping[str, str],
    slurm: SlurmAccess | None = None,
) -> RunResult:
    stream = sys.stderr if as_json else sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    # SIGTERM ends the run like Ctrl-C does: through the runner's clean-up, which stops the
    # local cluster it started (the default action would leave every daemon running).
    signal.signal(signal.SIGTERM, _exit_on_term)
    opts = RunOptions(
        out=out or default_out(loaded.scenario.name),
        cache=cache or state_base(env) / "control-runs",
        say=say,
        enforce_budgets=enforce_budgets,
        existing=existing,
        env=dict(env),
        slurm=slurm or SlurmAccess(),
    )
    return run(loaded, opts)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(signal_status(signum))
