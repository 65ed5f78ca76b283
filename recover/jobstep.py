"""``recover supervise-job``: the job supervisor run by the batch script of
``recover sbatch --spares S`` (docs/in-allocation.md)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from recovery.errors import RecoverError, UsageError, unknown_choice
from recovery.inalloc.decide import DEFAULT_MAX_RELAUNCHES, decision_line, exit_status
from recovery.inalloc.supervisor import (
    DEFAULT_GRACE_S,
    DEFAULT_STANDBY_AFTER_S,
    Supervisor,
    SupervisorJournal,
    install_forwarding,
)
from recovery.inalloc.vetting import Vetting
from recovery.pool.validate import ValidationSettings
from recovery.progress import Budgets
from recovery.progress.registry import read_site_budgets, registry_dir

if TYPE_CHECKING:
    from slurm.jobstep import JobSteps

#: ``--check-spares`` choices.
CHECK_MODES = ("auto", "always", "never")


def supervise_job(
    command: Annotated[list[str], typer.Argument(help="The training command, after '--'.")],
    processes: Annotated[int, typer.Option(help="Training processes, one per node.")],
    decision_file: Annotated[
        Path, typer.Option(help="Where to write the final decision for the batch script.")
    ],
    journal: Annotated[
        Path | None,
        typer.Option(help="JSON-lines journal [default: supervisor-<job id>.jsonl here]."),
    ] = None,
    max_relaunches: Annotated[
        int, typer.Option(help="Relaunches on a spare before the job requeues instead.")
    ] = DEFAULT_MAX_RELAUNCHES,
    grace: Annotated[
        float,
        typer.Option(help="Seconds to wait, after a failed step, for Slurm to name a lost node."),
    ] = DEFAULT_GRACE_S,
    standby_after: Annotated[
        float,
        typer.Option(
            help="Seconds into each launch before a standby training process is started on "
            "every node of the job, for the next launch to take instead of starting one."
        ),
    ] = DEFAULT_STANDBY_AFTER_S,
    no_standby: Annotated[
        bool,
        typer.Option("--no-standby", help="Start no standby: every launch starts its processes."),
    ] = False,
    signal_lead: Annotated[
        float,
        typer.Option(
            help="Seconds before the time limit Slurm sends the job USR1 (sbatch --signal): "
            "a USR1 with no more time left than this (and a minute) is the limit's warning, "
            "never the coordinator's 'save and leave' for a lost node."
        ),
    ] = 60.0,
    progress_dir: Annotated[
        Path | None,
        typer.Option(
            help="The run's progress folder: a launch whose processes stop finishing steps "
            "there is ended (after the node agents took its stacks) and relaunched. "
            "[default: RUN_DIR/progress of the command's --run-dir, or $RECOVER_PROGRESS_DIR]"
        ),
    ] = None,
    no_hang_watch: Annotated[
        bool,
        typer.Option("--no-hang-watch", help="Do not watch the launch's progress."),
    ] = False,
    check_spares: Annotated[
        str,
        typer.Option(
            help="Check each spare of the job before a relaunch puts work on it (the "
            "coordinator's checks of its agent, incidents and accelerators, then a burn-in "
            "step on it): 'auto' when the coordinator's policy has validation.required, "
            "'always', or 'never'. A spare that fails is drained with the failed check as "
            "its reason and given back."
        ),
    ] = "auto",
    coordinator: Annotated[
        str | None,
        typer.Option(
            envvar="RECOVER_COORDINATOR",
            help="The coordinator's URL, for the "
            "spares' checks [default: the one recorded in the state directory].",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(envvar="RECOVER_TOKEN_FILE", help="The coordinator's token file."),
    ] = None,
) -> None:
    """Run inside a --no-kill job: launch COMMAND on --processes of the job's nodes with
    srun, and when a node is lost relaunch it on one of the job's spare nodes (the batch
    host last); with no spare or relaunch left, write 'requeue' for the batch script. A
    standby process waits on every node of the job (started --standby-after seconds into a
    launch) so that a relaunch does not start JAX again. A launch that stops making progress
    (a process stuck or frozen: no step for longer than its steps justify) is ended and
    relaunched on the same nodes, or without a node named for two hangs in a row. Exit
    status: the step's."""
    from slurm.jobstep import JobSteps

    if max_relaunches < 0:
        raise UsageError(f"Invalid --max-relaunches {max_relaunches}: expected 0 or more")
    if not command:
        raise UsageError("No command to run: give it after '--'")
    if standby_after < 0:
        raise UsageError(f"Invalid --standby-after {standby_after:g}: expected 0 or more")
    if check_spares not in CHECK_MODES:
        raise unknown_choice("--check-spares", check_spares, CHECK_MODES)
    steps = JobSteps.from_env()
    path = journal or Path(f"supervisor-{steps.job_id}.jsonl")
    notes = SupervisorJournal(path)
    budgets, said = site_budgets(registry_dir(os.environ))
    if said:
        notes("site-budgets", said=said)
    supervisor = Supervisor(
        slurm=steps,
        command=command,
        processes=processes,
        batch_host=os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        journal=notes,
        budgets=budgets,
        max_relaunches=max_relaunches,
        grace_s=grace,
        standby_after_s=None if no_standby else standby_after,
        signal_lead_s=signal_lead,
        progress=None if no_hang_watch else (progress_dir or watched_progress(command)),
        steps=final_step(command),
    )
    supervisor.vetting = spare_vetting(
        check_spares, steps, coordinator, token_file, supervisor.batch_host, notes
    )
    install_forwarding(supervisor)
    decision = supervisor.run()
    decision_file.write_text(decision_line(decision) + "\n")
    raise typer.Exit(exit_status(decision))


def spare_vetting(
    mode: str,
    steps: JobSteps,
    url: str | None,
    token_file: Path | None,
    batch_host: str,
    journal: SupervisorJournal,
) -> Vetting | None:
    """How the job's spares are checked (``--check-spares``), journaled either way."""
    from recover.jobcheck import AllocationSpareCheck, site_policy
    from service.httpapi.client import Client

    if mode == "never":
        journal("spares-unchecked", why="--check-spares never")
        return None
    try:
        # A relaunch asks it about its spares: a coordinator that hangs costs at most this.
        client: Client | None = replace(Client.locate(url, token_file, None), timeout_s=2.0)
    except RecoverError as e:
        client, said = None, str(e)
    policy, said = site_policy(client, batch_host) if client is not None else (None, said)
    if mode == "auto" and (policy is None or not policy.required):
        why = said or "the coordinator's policy does not require validation"
        journal("spares-unchecked", why=f"--check-spares auto: {why}")
        return None
    settings = policy or ValidationSettings()
    journal("spares-checked", max_age_s=settings.max_age_s, burn_in=settings.burn_in,
            coordinator=client.url if client is not None else None,
            policy="the coordinator's" if policy else f"the defaults ({said})")  # fmt: skip
    check = AllocationSpareCheck(steps, client, settings, peer=batch_host)
    return Vetting(check, journal, max_age_s=settings.max_age_s)


def site_budgets(registry: Path) -> tuple[Budgets, str]:
    """The thresholds the job is judged by before its own: the site's, as the node's agent
    left them in ``registry`` (the coordinator's policy ``progress``), over the defaults; and
    what to journal about them ("" when there are none)."""
    site = read_site_budgets(registry)
    if not site:
        return Budgets(), ""
    try:
        return Budgets().overridden(site, "the site's progress thresholds"), f"taken: {site}"
    except UsageError as e:
        return Budgets(), f"refused ({e}); judging by the defaults"


def watched_progress(command: list[str], environ: Mapping[str, str] | None = None) -> Path | None:
    """The progress folder of the run ``command`` trains (its ``--run-dir``, relative to the
    working directory the processes share); None when the command names no run directory."""
    run_dir = None
    for i, arg in enumerate(command):
        if arg == "--run-dir" and i + 1 < len(command):
            run_dir = command[i + 1]
        elif arg.startswith("--run-dir="):
            run_dir = arg.split("=", 1)[1]
    if run_dir is None:
        return None
    # recovery.api brings numpy with it: not for every command line that loads this module.
    from recovery.api.progress import progress_dir

    return progress_dir(Path(run_dir).absolute(), environ)


def final_step(command: list[str]) -> int | None:
    """The command's ``--steps`` (recover train's final step); None when it names none."""
    for i, arg in enumerate(command):
        value = command[i + 1] if arg == "--steps" and i + 1 < len(command) else None
        if arg.startswith("--steps="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def register(root: typer.Typer) -> None:
    """Attach ``recover supervise-job``."""
    root.command("supervise-job")(supervise_job)
