"""Progress reports from a training loop, read by the job's watcher from outside the process:
``RUN_DIR/progress/rank<r>.progress`` (:mod:`recovery.progress.record`).

A loop that reports steps is watched for hangs (no step finished for longer than its own
recent steps justify) and its processes are told apart when one holds the others up; a loop
that reports nothing is not watched, and never accused. ``docs/library.md`` shows the calls.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recovery.contract.memplace import node_name
from recovery.errors import UsageError
from recovery.multiproc import topology_from_env
from recovery.progress.record import PHASES, Phase, ProgressWriter
from recovery.progress.registry import registry_dir
from recovery.progress.stall import Budgets, write_job_budgets

__all__ = [
    "ENV_PROGRESS_DIR",
    "ENV_STALL_BUDGETS",
    "PHASES",
    "Phase",
    "Progress",
    "open_progress",
    "progress_dir",
]

#: Where the records go instead of ``RUN_DIR/progress`` (the watcher must read it: shared
#: storage, or a node-local directory the node's agent reads).
ENV_PROGRESS_DIR = "RECOVER_PROGRESS_DIR"
#: The job's own stall thresholds, as JSON (``{"floor_s": 30, "phases_s": {"save": 1800}}``;
#: the keys of :data:`recovery.progress.BUDGET_KEYS`), when ``open_progress`` is given none.
ENV_STALL_BUDGETS = "RECOVER_STALL_BUDGETS"

#: One process's progress reporter (:class:`recovery.progress.ProgressWriter`).
Progress = ProgressWriter


def progress_dir(run_dir: Path | str, environ: Mapping[str, str] | None = None) -> Path:
    """The directory a run's processes write their progress records to."""
    env = os.environ if environ is None else environ
    return Path(env.get(ENV_PROGRESS_DIR) or Path(run_dir) / "progress")


def _with_until_step(budgets: Mapping[str, Any], until_step: int | None) -> Mapping[str, Any]:
    """``budgets`` whose straggler rule asks for swaps, told the step the job trains to
    unless it says so itself."""
    rule = budgets.get("straggler")
    if until_step is None or not isinstance(rule, Mapping) or rule.get("swap") is not True:
        return budgets
    if "until_step" in rule:
        return budgets
    return {**budgets, "straggler": {**rule, "until_step": until_step}}


def open_progress(
    run_dir: Path | str,
    *,
    budgets: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    until_step: int | None = None,
) -> ProgressWriter:
    """This process's progress reporter, its record in :func:`progress_dir` named after its
    rank (:func:`recovery.api.topology_from_env`), with a thread that keeps its liveness mark
    fresh, and an entry in the node's registry (``$RECOVER_PROGRESS_REGISTRY``, default
    ``/run/recover/progress``) through which the node's agent finds it. Report with
    ``step_started(n)`` (optional) and ``step_finished(n)``; wrap long phases in ``with
    progress.phase("save"):`` (``startup``, ``restore``, ``save``, ``evaluation``, ``data``,
    ``paused``); ``close()`` at the end marks the process done.

    Each call is a few stores into a shared mapping: no system call, about a microsecond.

    ``budgets`` (else ``$RECOVER_STALL_BUDGETS``, JSON) overrides the watchers' thresholds for
    this job: ``floor_s`` and ``factor`` (a step may take ``max(floor_s, factor x p99)``),
    ``learn_after`` and ``unlearned_s`` (the budget before that many steps are seen),
    ``frozen_after_s``, and ``phases_s`` (seconds by phase name), and ``straggler`` (the slow
    node rule: ``factor``, ``window_steps``, ``persist``, ``min_excess_s``, ``swap``,
    ``until_step``, ``swap_cost_s``). Process 0 keeps them beside the records, where the node
    agents and the job's supervisor read them. ``until_step``: the step the loop trains to;
    a job that asks for swaps (``straggler.swap``) is then moved off a slow node when the
    steps left make it pay.

    Raises UsageError when the directory cannot be written or the budgets are not valid
    (naming the valid keys).
    """
    env = os.environ if environ is None else environ
    topo = topology_from_env(env)
    directory = progress_dir(run_dir, env)
    where = "budgets"
    if budgets is None and env.get(ENV_STALL_BUDGETS, "").strip():
        where = f"${ENV_STALL_BUDGETS}"
        try:
            budgets = json.loads(env[ENV_STALL_BUDGETS])
        except ValueError as e:
            raise UsageError(f"{where} is not JSON: {e}") from None
    if budgets is not None:
        budgets = _with_until_step(budgets, until_step)
        Budgets().overridden(budgets, where)
        if topo.rank == 0:  # before its record: a watcher of the whole job finds them with it
            try:
                write_job_budgets(directory, budgets)
            except OSError as e:
                raise UsageError(f"cannot write the stall budgets to {directory}: {e}") from e
    writer = ProgressWriter(
        directory,
        rank=topo.rank,
        size=topo.size,
        node=node_name(env),
        registry=registry_dir(env),
        job=env.get("SLURM_JOB_ID", ""),
    )
    writer.start_alive()
    return writer
