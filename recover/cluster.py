"""``recover cluster ...`` and ``recover sbatch``: the local Slurm cluster and job submission.

Thin: each command parses its options and calls one function. ``up`` and ``down`` are
:mod:`service.bringup`'s (the scenario runner's local cluster starts the same way); which
cluster the other commands talk to is resolved in one place, :mod:`service.wiring`
(``--slurm-conf``, else ``$SLURM_CONF``, else the local cluster). The Slurm modules are
imported inside the commands so ``recover --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from recover.options import AsJson, SlurmBackend, SlurmVersion
from recovery.pool.spares import SparePool
from recovery.ports.slurm import SlurmControl
from service import bringup, wiring

app = typer.Typer(help="Start, inspect and stop a real local Slurm cluster.", no_args_is_help=True)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Folder holding the cluster's conf, logs, spool and pids "
        "[default: $RECOVER_STATE_DIR/slurm or ./.state/slurm].",
    ),
]
SlurmConf = Annotated[
    str | None,
    typer.Option(
        "--slurm-conf", help="slurm.conf of the cluster [default: $SLURM_CONF, else local cluster]."
    ),
]


def _state_dir(state_dir: Path | None) -> Path:
    return wiring.state_dir(state_dir, os.environ)


def _control(slurm_conf: str | None, state_dir: Path | None, backend: str | None) -> SlurmControl:
    # slurmrestd's address and JWT come from the environment here (RECOVER_SLURMRESTD, ...).
    return wiring.slurm_control(slurm_conf, state_dir, os.environ, wiring.SlurmAccess(backend))


@app.command()
def up(
    nodes: Annotated[int, typer.Option(help="Compute nodes (node1..nodeN).")] = 4,
    spares: Annotated[int, typer.Option(help="Spare nodes held drained (spare1..).")] = 1,
    state_dir: StateDir = None,
    slurmd_timeout: Annotated[
        int, typer.Option(help="Seconds before a silent slurmd's node goes DOWN.")
    ] = 10,
    coordinator: Annotated[
        bool,
        typer.Option(
            "--coordinator",
            help="Also start the coordinator (state in STATE_DIR/../coordinator, tokens "
            "generated there).",
        ),
    ] = False,
    agents: Annotated[
        bool,
        typer.Option(
            "--agents", help="Also start one node agent per node (implies --coordinator)."
        ),
    ] = False,
    rest: Annotated[
        bool,
        typer.Option(
            "--rest",
            help="Also accept JWTs and start slurmrestd (JWT on 127.0.0.1, local auth on a "
            "unix socket); `--slurm-backend rest` then finds it.",
        ),
    ] = False,
    slurm: SlurmVersion = None,
    as_json: AsJson = False,
) -> None:
    """Start munge, slurmctld and one slurmd per node; return once all nodes are idle."""
    d = _state_dir(state_dir)
    spec = bringup.LocalSpec(
        nodes=nodes, spares=spares, slurmd_timeout_s=slurmd_timeout, rest=rest,
        coordinator=coordinator, agents=agents, slurm=slurm,
    )  # fmt: skip
    got = bringup.up(d, spec)
    if as_json:
        typer.echo(json.dumps(got.to_json(), indent=2))
        return
    info, endpoint, restd = got.info, got.coordinator, got.restd
    verb = "started" if info.started else "already running"
    typer.echo(f"cluster {verb}: nodes {', '.join(info.nodes)}; spares {', '.join(info.spares)}")
    typer.echo(f"slurm: {_describe(info.conf_path)}")
    if endpoint is not None:
        typer.echo(
            f"coordinator at {endpoint.url} (state in {endpoint.state_dir}; "
            f"`recover status --state-dir {shlex.quote(str(endpoint.state_dir))}`)"
        )
    if agents and endpoint is not None:
        logs = endpoint.state_dir / "agents"
        typer.echo(f"agents: one per node; simulated kernel logs in {logs}/NODE/kmsg")
    if restd is not None:
        typer.echo(
            f"slurmrestd at {restd.url} (JWT for {restd.user} in {restd.token_file}) and "
            f"unix:{restd.socket} (local auth, acts as nobody)"
        )
    typer.echo(_env_lines(info.conf_path))


def _describe(conf: Path) -> str:
    from slurm import install

    return (install.of_conf(conf) or install.SYSTEM).describe()


def _env_lines(conf: Path) -> str:
    # The install's commands first on PATH: a 22.05 sinfo cannot talk to a 25.11 slurmctld.
    from slurm import install

    lines = [f"export SLURM_CONF={shlex.quote(str(conf))}"]
    inst = install.of_conf(conf)
    if inst is not None and inst.prefix is not None:
        dirs = ":".join(shlex.quote(str(d)) for d in inst.bin_dirs)
        lines.append(f'export PATH={dirs}:"$PATH"')
    return "\n".join(lines)


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop every process the cluster started (a no-op when none runs)."""
    stopped = bringup.down(_state_dir(state_dir))
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "no cluster was running")


@app.command()
def status(
    slurm_conf: SlurmConf = None, state_dir: StateDir = None, as_json: AsJson = False
) -> None:
    """Show the cluster's processes and nodes (state, flags, reason)."""
    st = wiring.cluster_status(slurm_conf, state_dir, os.environ)
    typer.echo(json.dumps(st.to_json(), indent=2) if as_json else st.render())
    if not st.running:
        raise typer.Exit(1)


@app.command()
def env(state_dir: StateDir = None) -> None:
    """Print the lines that point Slurm's commands at the cluster (its conf, and on 25.11 its
    programs first on PATH): eval "$(recover cluster env)"."""
    from slurm.cluster import resolve_conf

    typer.echo(_env_lines(resolve_conf(None, _state_dir(state_dir))))


@app.command()
def promote(
    node: Annotated[
        str | None, typer.Argument(help="Spare to promote [default: first ready by name].")
    ] = None,
    slurm_conf: SlurmConf = None,
    state_dir: StateDir = None,
    slurm_backend: SlurmBackend = None,
) -> None:
    """Bring one spare into service and print its name."""
    control = _control(slurm_conf, state_dir, slurm_backend)
    typer.echo(SparePool(control).promote(node))


@app.command()
def retire(
    node: Annotated[str, typer.Argument(help="Node to take back into the spare pool.")],
    slurm_conf: SlurmConf = None,
    state_dir: StateDir = None,
    slurm_backend: SlurmBackend = None,
) -> None:
    """Take a (repaired) node out of service into the spare pool."""
    changed = SparePool(_control(slurm_conf, state_dir, slurm_backend)).retire(node)
    typer.echo(f"{node}: {'retired into the pool' if changed else 'already a spare'}")


class _KeepsRawArgs(TyperCommand):
    """Remembers the raw arguments: click drops the ``--`` that separates sbatch's options
    from the training command, and only the raw list still shows where it was."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["recover.raw_args"] = list(args)
        return super().parse_args(ctx, args)


def sbatch(
    ctx: typer.Context,
    signal_lead: Annotated[
        int, typer.Option(help="Seconds before the time limit that USR1 is sent.")
    ] = 60,
    job_name: Annotated[str | None, typer.Option(help="Job name [default: recover-train].")] = None,
    slurm_conf: SlurmConf = None,
    state_dir: StateDir = None,
    slurm_backend: SlurmBackend = None,
    print_script: Annotated[
        bool, typer.Option(help="Print the batch script instead of submitting it.")
    ] = False,
    processes: Annotated[
        int | None,
        typer.Option(
            help="Processes to run, one per node, in one srun step [default: the -N count "
            "for recover train, else 1]; 1 runs the command once in the batch step."
        ),
    ] = None,
    spares: Annotated[
        int,
        typer.Option(
            help="Spare nodes the job holds for itself: -N K --spares S asks K+S nodes with "
            "--no-kill and relaunches training on a spare when a node is lost, without a "
            "requeue (docs/in-allocation.md); 0 is the plain requeue path."
        ),
    ] = 0,
    max_relaunches: Annotated[
        int | None,
        typer.Option(
            help="With --spares: relaunches on the job's own spares before it requeues "
            "instead [default: 3, the supervisor's]."
        ),
    ] = None,
) -> None:
    """Submit `-- COMMAND...` as a requeueable job: recover sbatch [sbatch options] -- recover
    train ...; prints the job id. With -N K, recover train runs as K processes, one per node
    (data parallel; see docs/multiprocess.md); --spares S keeps S more nodes in the job to
    recover on (docs/in-allocation.md)."""
    from slurm.sbatch import (
        default_processes,
        job_workdir,
        requeue_warning,
        resolve_program,
        submit_training,
        training_job,
    )

    raw: list[str] = ctx.meta.get("recover.raw_args", [])
    command = raw[raw.index("--") + 1 :] if "--" in raw else []
    sbatch_args = ctx.args[: len(ctx.args) - len(command)]
    # what the job cannot find would fail it at once
    command = resolve_program(command, workdir=job_workdir(sbatch_args))
    count = default_processes(command, sbatch_args) if processes is None else processes
    if print_script:
        job = training_job(
            command,
            sbatch_args=sbatch_args,
            signal_lead_s=signal_lead,
            processes=count,
            spares=spares,
            max_relaunches=max_relaunches,
        )
        typer.echo(job.script)
        return
    warning = requeue_warning(sbatch_args)
    if warning:
        typer.echo(warning, err=True)
    job_id = submit_training(
        _control(slurm_conf, state_dir, slurm_backend),
        command,
        sbatch_args=sbatch_args,
        signal_lead_s=signal_lead,
        job_name=job_name,
        processes=count,
        spares=spares,
        max_relaunches=max_relaunches,
    )
    typer.echo(job_id)


def register(root: typer.Typer) -> None:
    """Attach top-level commands that belong to the Slurm side (``recover sbatch``)."""
    root.command(
        "sbatch",
        cls=_KeepsRawArgs,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )(sbatch)
