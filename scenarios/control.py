"""The control run: the same training, uninterrupted and outside Slurm, whose final state
digest a scenario's job must reach bit for bit.

Computed once per training configuration and cached in ``CACHE/<key>/digest``. The key covers
everything the trajectory depends on (model, steps, seed; the checkpoint interval and the step
sleep do not change it) plus a fingerprint of the training and checkpoint code and of the jax
version, so a change there never compares against a stale digest. Runs happen in a temporary
folder renamed into place, so two runs computing the same control never see half of one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from recovery.errors import RecoverError
from recovery.proc import free_ports
from scenarios.digests import cached_digest, code_fingerprint, compile_cache, final_digest
from scenarios.schema import JobSpec

#: Runs ``recover train`` with these options; returns (exit status, stderr).
Train = Callable[[Sequence[str]], tuple[int, str]]


def cache_key(job: JobSpec, processes: int = 1) -> str:
    """16 hex digits naming the control run of ``job``'s training configuration run as
    ``processes`` processes (the sum of the gradients is reduced in another order with
    another count, so the digest depends on it)."""
    doc: dict[str, object] = {
        "model": job.model,
        "steps": job.steps,
        "seed": job.seed,
        "code": code_fingerprint(),
    }
    if processes > 1:  # one process keeps the keys (and the caches) it always had
        doc["processes"] = processes
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def run_train(args: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """``python -m recover train ARGS`` in a child process (JAX stays out of this one),
    started with ``env`` (None: this process's environment)."""
    done = subprocess.run(
        [sys.executable, "-m", "recover", "train", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=None if env is None else dict(env),
    )
    return done.returncode, done.stderr


def run_train_ranks(
    args: Sequence[str], processes: int, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """``python -m recover train ARGS`` as ``processes`` processes on this machine, joined
    through a rendezvous on the loopback (the launcher contract of docs/multiprocess.md),
    started with ``env`` (None: this process's environment). Returns the first non-zero exit
    status (0 when all succeeded) and every process's stderr.
    """
    if processes == 1:
        return run_train(args, env)
    port = free_ports(1)[0]
    children = []
    for rank in range(processes):
        rank_env = dict(os.environ if env is None else env)
        rank_env.update(RECOVER_NUM_PROCESSES=str(processes), RECOVER_PROCESS_ID=str(rank),
                   RECOVER_RENDEZVOUS=f"127.0.0.1:{port}")  # fmt: skip
        for key in [k for k in rank_env if k.startswith("SLURM_")]:
            del rank_env[key]  # not a step of the caller's job, if it runs in one
        children.append(subprocess.Popen(
            [sys.executable, "-m", "recover", "train", *args], env=rank_env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    errors, statuses = [], []
    for rank, child in enumerate(children):
        try:
            _, err = child.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
        statuses.append(child.returncode)
        if child.returncode:
            errors.append(f"process {rank} (exit {child.returncode}): {err[-1500:]}")
    return next((s for s in statuses if s), 0), "\n".join(errors)


def control_digest(
    job: JobSpec,
    cache: Path,
    *,
    processes: int = 1,
    train: Train | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """The final state digest of ``job``'s training run without interruption, as
    ``processes`` processes: from the cache, else computed now with ``train`` (default: run
    the trainer as that many local processes, started with ``env``; None: this process's
    environment) and cached.

    Raises RecoverError with the trainer's error output when the run fails.
    """
    if job.command is not None:  # a command job: its own control run
        from scenarios import command_job

        return command_job.job_control_digest(job, cache, env)
    if train is None:
        train = functools.partial(run_train_ranks, processes=processes, env=env)

    def produce(run: Path) -> str:
        args = [
            "--run-dir", str(run), "--steps", str(job.steps), "--save-every", str(job.steps),
            "--model", job.model, "--seed", str(job.seed),
            "--compile-cache", str(compile_cache(cache)),
        ]  # fmt: skip
        status, err = train(args)
        if status != 0:
            raise RecoverError(f"the control run failed (exit {status}):\n{err[-2000:]}")
        return final_digest(run / "events.jsonl")

    config = json.dumps(
        {**job.model_dump(include={"model", "steps", "seed"}), "processes": processes},
        sort_keys=True,
    )
    return cached_digest(cache, cache_key(job, processes), produce, ("config.json", config))


class Background:
    """:func:`control_digest` on a thread, so the control trains while the cluster starts."""

    def __init__(
        self,
        job: JobSpec,
        cache: Path,
        *,
        processes: int = 1,
        train: Train | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._result: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._work, args=(job, cache, processes, train, env), name="control-run",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def _work(
        self,
        job: JobSpec,
        cache: Path,
        processes: int,
        train: Train | None,
        env: Mapping[str, str] | None,
    ) -> None:
        try:
            self._result = control_digest(job, cache, processes=processes, train=train, env=env)
        except BaseException as e:  # handed to the caller of result()
            self._error = e

    def result(self, timeout_s: float = 900.0) -> str:
        """The digest; raises what the run raised, or RecoverError after ``timeout_s``."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RecoverError(f"the control run did not finish within {timeout_s:g} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
