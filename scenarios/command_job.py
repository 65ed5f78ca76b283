"""A scenario's command job: your own training command in place of ``recover train``
(``job: command: [...]``), and its control run.

The command is a list of arguments with placeholders filled in for each run:

================  ================================================================
``{python}``      the Python interpreter the runner runs on (it has the toolkit)
``{run_dir}``     the job's run directory: checkpoints under ``checkpoints/``, the
                  event log ``events.jsonl`` that the report reads (docs/library.md)
``{steps}``       ``job.steps``; ``{save_every}``: ``job.save_every``; ``{seed}``: ``job.seed``
``{step_sleep}``  ``job.step_sleep`` (0 for the control run)
``{scenario_dir}`` the folder of the scenario file (for a script shipped beside it)
================  ================================================================

``{{`` and ``}}`` are literal braces. The command must behave as ``recover train`` does
(``recovery.api`` gives all of it): resume from its newest checkpoint when run again, save and
exit 75 on SIGTERM/SIGUSR1, log ``started``/``step``/``checkpoint``/``restored``/``completed``,
hold the run lock of ``{run_dir}/checkpoints`` while it trains (faults find the training
process by it), and end with the same state digest however often it was interrupted.

The control run is the same command run once, uninterrupted, outside Slurm; its final digest
is cached under a key covering the command, the configuration, the bytes of every file the
command names and the toolkit's code fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from recovery.errors import RecoverError
from scenarios.digests import cached_digest, code_fingerprint, compile_cache, final_digest
from scenarios.placeholders import check

if TYPE_CHECKING:
    from scenarios.schema import JobSpec, Scenario

def beside(scenario: Scenario, folder: Path) -> Scenario:
    """``scenario`` with ``{scenario_dir}`` in its command job replaced by ``folder`` (the
    folder of the file it was read from); unchanged for a ``recover train`` job."""
    command = scenario.job.command
    if command is None:
        return scenario
    where = str(folder.resolve()).replace("{", "{{").replace("}", "}}")
    job = scenario.job.model_copy(
        update={"command": [a.replace("{scenario_dir}", where) for a in command]}
    )
    return scenario.model_copy(update={"job": job})


def job_command(job: JobSpec, run_dir: Path, cache: Path) -> list[str]:
    """What the scenario's Slurm job runs: the command filled in for ``run_dir``, started
    through ``env`` with the compilation cache the control run shares (``env`` execs it, so
    the training process is the command itself)."""
    assert job.command is not None
    argv = fill(job.command, run_dir=run_dir, steps=job.steps, save_every=job.save_every,
                seed=job.seed, step_sleep=job.step_sleep)  # fmt: skip
    return ["env", *(f"{k}={v}" for k, v in job_env(cache).items()), *argv]


def job_control_digest(job: JobSpec, cache: Path, env: Mapping[str, str] | None = None) -> str:
    """:func:`control_digest` of ``job``'s command, run with ``env`` (None: this process's
    environment)."""
    assert job.command is not None
    return control_digest(job.command, steps=job.steps, save_every=job.save_every,
                          seed=job.seed, cache=cache, env=env)  # fmt: skip


def fill(
    command: Sequence[str],
    *,
    run_dir: Path,
    steps: int,
    save_every: int,
    seed: int,
    step_sleep: float,
    scenario_dir: Path | None = None,
) -> list[str]:
    """The command's arguments with the placeholders filled in (``{scenario_dir}``: the
    current folder when the scenario was not read from a file)."""
    values = {
        "python": sys.executable,
        "run_dir": str(run_dir),
        "steps": str(steps),
        "save_every": str(save_every),
        "seed": str(seed),
        "step_sleep": f"{step_sleep:g}",
        "scenario_dir": str(Path.cwd() if scenario_dir is None else scenario_dir),
    }
    return [arg.format(**values) for arg in check(command)]


def cache_key(command: Sequence[str], steps: int, seed: int) -> str:
    """16 hex digits naming the control run: the command as given, the configuration the
    trajectory depends on, the contents of every file an argument names (the training
    script), and the toolkit's code fingerprint."""
    filled = fill(command, run_dir=Path("RUN"), steps=steps, save_every=steps, seed=seed,
                  step_sleep=0)  # fmt: skip
    files = {}
    for arg in filled[1:]:
        path = Path(arg)
        if path.is_file():
            files[str(path.resolve())] = hashlib.sha256(path.read_bytes()).hexdigest()
    doc = {"command": list(command), "steps": steps, "seed": seed, "files": files,
           "code": code_fingerprint()}  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def control_digest(
    command: Sequence[str],
    *,
    steps: int,
    save_every: int,
    seed: int,
    cache: Path,
    env: Mapping[str, str] | None = None,
) -> str:
    """The final state digest of the command run uninterrupted: cached, else run now.

    Raises:
        RecoverError: the command failed (its error output is quoted) or logged no
            ``completed`` event with a digest.
    """
    def produce(run: Path) -> str:
        argv = fill(command, run_dir=run, steps=steps, save_every=save_every, seed=seed,
                    step_sleep=0)  # fmt: skip
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=900, check=False,
            env={**(os.environ if env is None else env), **job_env(cache)},
        )  # fmt: skip
        if done.returncode != 0:
            raise RecoverError(
                f"the control run of {argv} failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
            )
        return final_digest(run / "events.jsonl")

    key = "command-" + cache_key(command, steps, seed)
    return cached_digest(cache, key, produce, ("command.json", json.dumps(list(command))))


def job_env(cache: Path) -> dict[str, str]:
    """Variables for the command's processes: JAX's persistent compilation cache shared by
    the control run and the job (the same programs), as ``recover train`` shares it."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(compile_cache(cache)),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
