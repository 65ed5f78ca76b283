"""``recover train``: the JAX training entrypoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from recovery.errors import UsageError


def train(
    run_dir: Annotated[Path, typer.Option(help="Run directory: events.jsonl and checkpoints/.")],
    steps: Annotated[int, typer.Option(help="Final step (total updates, not additional ones).")],
    save_every: Annotated[int, typer.Option(help="Checkpoint every K steps and at the end.")],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the newest intact checkpoint.")
    ] = False,
    auto_resume: Annotated[
        bool,
        typer.Option(
            "--auto-resume",
            help="Continue if a checkpoint exists, else start fresh (for requeued jobs).",
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of parameters, dropout and data.")] = 0,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 1e-3,
    model: Annotated[
        str,
        typer.Option(
            help="Model preset: mlp-tiny, mlp-tiny-48 (batch divides by 3), mlp-small, "
            "mlp-medium, mlp-1g."
        ),
    ] = "mlp-tiny",
    keep_last: Annotated[int, typer.Option(help="Retention: newest checkpoints kept.")] = 3,
    keep_every: Annotated[
        int | None, typer.Option(help="Retention: also keep steps divisible by this.")
    ] = None,
    sync_save: Annotated[
        bool, typer.Option("--sync-save", help="Block on every save instead of saving async.")
    ] = False,
    step_sleep: Annotated[
        float, typer.Option(help="Seconds to pause after each step (demos, fault tests).")
    ] = 0.0,
    compile_cache: Annotated[
        Path | None,
        typer.Option(
            help="JAX compilation cache dir, so a restarted job skips compiling. "
            "Default: RUN_DIR/compile-cache; pass --no-compile-cache to disable."
        ),
    ] = None,
    no_compile_cache: Annotated[
        bool, typer.Option("--no-compile-cache", help="Do not use a compilation cache.")
    ] = False,
    cpu_devices: Annotated[
        int | None,
        typer.Option(help="Split the host CPU into N JAX devices (sets XLA_FLAGS)."),
    ] = None,
    lock_wait: Annotated[
        float,
        typer.Option(
            help="Seconds to wait for the run lock while another process holds it: an "
            "earlier run's process on a node that hung keeps it until the node is "
            "power-cycled (on NFS, until its lease runs out, 90 s by default). Then exit 3."
        ),
    ] = 120.0,
    memory_every: Annotated[
        int,
        typer.Option(
            envvar="RECOVER_MEMORY_EVERY",
            help="Several processes: keep a verified copy of the state in node-local memory "
            "every N steps (0: off). A relaunched job restores from a surviving node's copy "
            "when it is at least as new as the newest checkpoint. `recover supervise-job` "
            "sets 1.",
        ),
    ] = 0,
    memory_budget: Annotated[
        float,
        typer.Option(
            envvar="RECOVER_MEMORY_BUDGET",
            help="Share of the wall time the memory copies may take (process 0 spaces them "
            "out to stay within it; with steps of a tenth of a second or more that is still "
            "a copy every step).",
        ),
    ] = 0.025,
    memory_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="RECOVER_MEMORY_DIR",
            help="Root of the node-local copies (a tmpfs). "
            "Default: /dev/shm/slurm-k8s-recover-UID.",
        ),
    ] = None,
    save_delay: Annotated[
        float,
        typer.Option(
            help="Long phases (proving the hang watcher sits through them): seconds process 0 "
            "spends on top of each periodic save, in its save phase, as on slow storage; the "
            "other processes wait for it at the next step.",
        ),
    ] = 0.0,
    eval_every: Annotated[
        int,
        typer.Option(
            help="Process 0 evaluates the loss on a held-out batch after every N steps (not "
            "the last), in an evaluation phase, while the others wait at the next step (0: "
            "never).",
        ),
    ] = 0,
    eval_seconds: Annotated[
        float, typer.Option(help="Seconds each evaluation lasts in all (with --eval-every).")
    ] = 0.0,
    pause_at: Annotated[
        int,
        typer.Option(
            help="After this step every process is paused (the paused phase) for "
            "--pause-seconds; a preemption signal ends it early (0: no pause).",
        ),
    ] = 0,
    pause_seconds: Annotated[
        float, typer.Option(help="Seconds the pause lasts (with --pause-at).")
    ] = 0.0,
    first_step_delay: Annotated[
        float,
        typer.Option(
            help="Seconds each process's first step takes longer, unannounced: a loop that "
            "compiles lazily, in its first step. None of these long phases changes the "
            "training: the final digest is the same.",
        ),
    ] = 0.0,
) -> None:
    """Train a small real JAX model with verified, resumable checkpoints.

    Events go to RUN_DIR/events.jsonl. On SIGTERM or SIGUSR1 the current step finishes, a
    checkpoint is saved and the process exits with status 75 (resume it with --resume or
    --auto-resume). Exit status 0: completed; 2: bad options; 3: checkpoint problem.

    Started as K processes by srun (one task per node; `recover sbatch -N K` does it) or with
    RECOVER_NUM_PROCESSES/RECOVER_PROCESS_ID, and RECOVER_RENDEZVOUS=HOST:PORT of process 0,
    the processes train data parallel, save and restore together and stop after the same
    step; process r>0 logs to RUN_DIR/events.rank<r>.jsonl. When one dies the others stop
    within moments with status 76; 11: the processes could not join.

    RECOVER_STANDBY=1 (set by `recover supervise-job`): import everything first, then read
    the launch's variables as one JSON line from stdin (end of input: exit 0).
    """
    if resume and auto_resume:
        raise UsageError("--resume and --auto-resume are exclusive; pass one")
    if cpu_devices is not None:
        _force_cpu_devices(cpu_devices)
    _standby()

    from recovery.api.ranks import exit_now
    from recovery.contract.exits import EXIT_PREEMPTED, PREEMPT_SIGNALS
    from recovery.multiproc import topology_from_env
    from recovery.train.loop import ResumeMode, TrainOptions, run_training
    from recovery.train.options import LongPhases

    mode = ResumeMode.required if resume else ResumeMode.auto if auto_resume else ResumeMode.never
    multi = topology_from_env(os.environ).multi
    if multi:
        # Once the run is over, the first process to exit 75 makes srun's --kill-on-bad-exit
        # TERM the others while they exit too: ignored, each keeps its own status (75), so
        # the step's is 75 and the job requeues. While the run lasts its handlers take them.
        for sig in PREEMPT_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    try:
        outcome = run_training(
            TrainOptions(
                run_dir=run_dir,
                steps=steps,
                save_every=save_every,
                resume=mode,
                seed=seed,
                lr=lr,
                model=model,
                keep_last=keep_last,
                keep_every=keep_every,
                async_save=not sync_save,
                step_sleep=step_sleep,
                lock_wait=lock_wait,
                memory_every=memory_every,
                memory_dir=memory_dir,
                memory_budget=memory_budget,
                long_phases=LongPhases(
                    save_delay=save_delay,
                    eval_every=eval_every,
                    eval_seconds=eval_seconds,
                    pause_at=pause_at,
                    pause_seconds=pause_seconds,
                    first_step_delay=first_step_delay,
                ),
                compile_cache=None
                if no_compile_cache
                else (compile_cache or run_dir / "compile-cache"),
            )
        )
    except BaseException as e:
        if multi:
            exit_now(e)  # Python's exit hooks would wait for the other processes
        raise
    if outcome.preempted:
        raise typer.Exit(EXIT_PREEMPTED)
    typer.echo(f"completed step {outcome.step} state_digest {outcome.state_digest}")


def _standby() -> None:
    """Under RECOVER_STANDBY=1 (the job supervisor's processes started ahead of need): warm
    up, then wait for the assignment on stdin and take it; end of input: exit 0 at once."""
    import sys

    from recovery.contract.standby import requested
    from recovery.train import standby

    if not requested(os.environ):
        return
    assignment = standby.wait(sys.stdin)
    if assignment is None:
        raise typer.Exit(0)
    os.environ.update(assignment)


def _force_cpu_devices(n: int) -> None:
    import sys

    if n < 1:
        raise UsageError(f"--cpu-devices must be >= 1 (got {n})")
    if "jax" in sys.modules:
        raise UsageError("--cpu-devices must be set before JAX is imported")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def register(root: typer.Typer) -> None:
    """Attach ``recover train`` to the root command."""
    root.command("train")(train)
