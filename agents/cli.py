"""``recover agent ...``: the agent's commands. ``run`` runs the node agent
(:mod:`agents.runtime`). ``parse`` shows what the kernel-log
source would report for a saved log (dmesg, syslog, journalctl text, json or export, a
/dev/kmsg dump, from a real incident), so a detector can be checked against the incident
before it is trusted (:mod:`agents.logfile`).

Only light imports here (no pynvml, no grpc): the ``recover`` CLI imports this module at start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from agents.busid import bus_map
from agents.follow import DEV_KMSG
from agents.logfile import parse_file
from agents.runtime import DEFAULT_SOURCES, SOURCES, Agent, AgentConfig, run_agent
from recovery import climain
from recovery.contract.workload import DEFAULT_DIR
from recovery.errors import UsageError, unknown_choice
from recovery.progress.registry import registry_dir

app = typer.Typer(
    name="agent",
    help="The node agent: run it, or check what it would detect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """The node agent: run it, or check what it would detect."""  # keeps commands as such


def parse_buses(specs: Sequence[str]) -> dict[str, int]:
    """``["0=00000000:18:00.0", ...]`` -> a bus map. Raises UsageError naming the form."""
    devices = []
    for spec in specs:
        index, sep, bus = spec.partition("=")
        try:
            if not sep or not index.isdigit():
                raise ValueError(spec)
            devices.append((int(index), bus))
            bus_map(devices[-1:])  # validates the bus id
        except ValueError as e:
            raise UsageError(
                f"--gpu {spec!r}: expected INDEX=BUSID, e.g. 0=00000000:18:00.0"
            ) from e
    return bus_map(devices)


@app.command("parse")
def parse_cmd(
    file: Annotated[
        Path,
        typer.Argument(
            help="A saved kernel log: dmesg, syslog, journalctl (text, json, export), kmsg."
        ),
    ],
    node: Annotated[str, typer.Option(help="Node name to put in the events.")] = "local",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array of events.")] = False,
    gpu: Annotated[
        list[str] | None,
        typer.Option(help="INDEX=BUSID (NVML form), repeatable: fills in accelerator indices."),
    ] = None,
    window: Annotated[
        float, typer.Option(help="Fold repeats within this many seconds (0: show every line).")
    ] = 0.0,
) -> None:
    """Print the events the kernel-log source would emit for FILE."""
    text = parse_file(file, node, as_json, buses=parse_buses(gpu or []), window_s=window)
    typer.echo(text)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); UsageError naming the form otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise UsageError(
            f"Invalid --metrics-listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9470"
        )
    return host.strip("[]"), int(port)  # [::1]:9470 names the IPv6 host ::1


def agent_config(
    *,
    node: str,
    coordinator: str,
    token_file: Path,
    sources: str,
    spool: Path | None,
    kmsg_file: Path,
    gpus: Sequence[str] = (),
    simulated_gpus: int = 0,
    dedup_window_s: float = 30.0,
    heartbeat_s: float = 5.0,
    kmsg_interval_s: float = 0.05,
    kmsg_from: str = "auto",
    tpu_workload_dir: Path = DEFAULT_DIR,
    progress_registry: Path | None = None,
    metrics_listen: str | None = None,
) -> AgentConfig:
    """The agent's settings from ``recover agent run``'s options. Raises UsageError naming
    what is valid (sources, bus ids, the token file's form)."""
    from agents.inject import simulated_buses
    from agents.link import read_agent_token

    names = tuple(s.strip() for s in sources.split(",") if s.strip())
    for name in names:
        if name not in SOURCES:
            raise unknown_choice("source", name, SOURCES)
    buses = {**simulated_buses(simulated_gpus), **parse_buses(gpus)}
    for what, value in (("--dedup-window", dedup_window_s), ("--heartbeat", heartbeat_s)):
        if value <= 0:
            raise UsageError(f"{what} must be > 0 seconds, got {value}")
    return AgentConfig(
        node=node,
        coordinator=coordinator,
        token=read_agent_token(token_file, node),
        spool_dir=spool or Path(f"/var/lib/recover-agent/{node}/spool"),
        sources=names,
        kmsg_file=kmsg_file,
        kmsg_interval_s=kmsg_interval_s,
        buses=buses,
        simulated_gpus=simulated_gpus,
        metrics_listen=parse_listen(metrics_listen) if metrics_listen else None,
        dedup_window_s=dedup_window_s,
        heartbeat_s=heartbeat_s,
        kmsg_from=kmsg_from,
        tpu_workload_dir=tpu_workload_dir,
        progress_registry=progress_registry or registry_dir(os.environ),
    )


@app.command("run")
def run_cmd(
    node: Annotated[str, typer.Option(help="This node's name (as Slurm knows it).")],
    coordinator: Annotated[
        str, typer.Option(help="The coordinator's URL, or its replicas' URLs comma-separated.")
    ],
    token_file: Annotated[
        Path,
        typer.Option(help="The tokens file (its 'node NAME TOKEN' line) or a file of the token."),
    ],
    sources: Annotated[
        str, typer.Option(help=f"Comma-separated, of: {', '.join(SOURCES)}.")
    ] = ",".join(DEFAULT_SOURCES),
    spool: Annotated[
        Path | None, typer.Option(help="Spool directory [/var/lib/recover-agent/NODE/spool].")
    ] = None,
    kmsg_file: Annotated[
        Path, typer.Option(help="Kernel log to follow (a plain file for simulated nodes).")
    ] = DEV_KMSG,
    gpu: Annotated[
        list[str] | None,
        typer.Option(help="INDEX=BUSID (NVML form), repeatable: GPU indices for kernel lines."),
    ] = None,
    simulated_gpus: Annotated[
        int, typer.Option(help="Simulated node: give GPUs 0..N-1 made-up bus ids.")
    ] = 0,
    dedup_window: Annotated[float, typer.Option(help="Fold repeats within S seconds.")] = 30.0,
    heartbeat: Annotated[float, typer.Option(help="Heartbeat every S seconds.")] = 5.0,
    kmsg_interval: Annotated[float, typer.Option(help="Read the kernel log every S s.")] = 0.05,
    kmsg_from: Annotated[
        str,
        typer.Option(
            help="Kernel-log sources: auto (this boot from its start, after the saved read "
            "mark), start (this boot from its start) or end (new lines only)."
        ),
    ] = "auto",
    tpu_workload_dir: Annotated[
        Path,
        typer.Option(
            help="Where TPU training jobs keep their markers ($RECOVER_TPU_WORKLOAD_DIR)."
        ),
    ] = DEFAULT_DIR,
    progress_registry: Annotated[
        Path | None,
        typer.Option(
            help="Where training processes register their progress records "
            "[$RECOVER_PROGRESS_REGISTRY, else /run/recover/progress]."
        ),
    ] = None,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            help="Serve the agent's Prometheus metrics on HOST:PORT (/metrics): events "
            "detected by source, spool depth, seconds since the last delivery and the last "
            "heartbeat answer. [default: not served]"
        ),
    ] = None,
) -> None:
    """Run the node agent until SIGTERM: detect, spool, deliver, heartbeat, obey commands."""
    config = agent_config(
        node=node,
        coordinator=coordinator,
        token_file=token_file,
        sources=sources,
        spool=spool,
        kmsg_file=kmsg_file,
        gpus=gpu or (),
        simulated_gpus=simulated_gpus,
        dedup_window_s=dedup_window,
        heartbeat_s=heartbeat,
        kmsg_interval_s=kmsg_interval,
        kmsg_from=kmsg_from,
        tpu_workload_dir=tpu_workload_dir,
        progress_registry=progress_registry,
        metrics_listen=metrics_listen,
    )
    run_agent(Agent(config, log=_log))


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m agents ...``: the agent's commands without the rest of ``recover``."""
    return climain.run(app, argv, prog="recover agent")
