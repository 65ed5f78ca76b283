"""``recover coordinator serve`` and ``recover policy replay``. Thin: parse, call one function."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from recover.options import AsJson, SlurmBackend, SlurmJwtFile, SlurmRestd, SlurmUser
from recovery.coordinator.leader import DURATION_S, RENEW_DEADLINE_S, RETRY_S

app = typer.Typer(help="Run the coordinator (events in, Slurm actions out).", no_args_is_help=True)
policy_app = typer.Typer(help="Inspect the fault policy.", no_args_is_help=True)


@app.command()
def serve(
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="Journal, tokens and endpoint live here.")
    ] = Path(".state/coordinator"),
    listen: Annotated[
        str, typer.Option(help="HOST:PORT to listen on (port 0: a free one).")
    ] = "127.0.0.1:8470",
    slurm_conf: Annotated[
        str | None,
        typer.Option(envvar="SLURM_CONF", help="slurm.conf [default: the local cluster]."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="Policy file (YAML): overrides, windows, breaker, spares.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and record, but apply no action.")
    ] = False,
    tick: Annotated[float, typer.Option(help="Seconds between Slurm reconcile polls.")] = 0.5,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            envvar="RECOVER_KUBECONFIG", help="Kubernetes mode: the cluster in this kubeconfig."
        ),
    ] = None,
    in_cluster: Annotated[
        bool,
        typer.Option(
            "--in-cluster",
            envvar="RECOVER_IN_CLUSTER",
            help="Kubernetes mode: this pod's ServiceAccount (recover-coordinator).",
        ),
    ] = False,
    k8s_namespace: Annotated[
        str, typer.Option(envvar="RECOVER_K8S_NAMESPACE", help="Namespace of the slurmd pods.")
    ] = "slurm",
    k8s_pod_selector: Annotated[
        str,
        typer.Option(envvar="RECOVER_K8S_POD_SELECTOR", help="Label selector of slurmd pods."),
    ] = "app.kubernetes.io/component=slurmd",
    k8s_taint_effect: Annotated[
        str, typer.Option(help="Effect of our taint: NoSchedule or NoExecute.")
    ] = "NoSchedule",
    k8s_pod_removal: Annotated[
        str, typer.Option(help="How slurmd pods go: delete, or evict (Eviction API).")
    ] = "delete",
    slinky: Annotated[
        bool,
        typer.Option(
            "--slinky",
            envvar="RECOVER_SLINKY",
            help="Slinky cluster: drain through the slurm-operator's pod annotation.",
        ),
    ] = False,
    slurm_backend: SlurmBackend = None,
    slurmrestd: SlurmRestd = None,
    slurm_jwt_file: SlurmJwtFile = None,
    slurm_user: SlurmUser = None,
    journal_dsn: Annotated[
        str | None,
        typer.Option(
            envvar="RECOVER_JOURNAL_DSN",
            help="Keep the journal in this PostgreSQL database (a libpq URL or key=value "
            "string) instead of the state dir's SQLite file: what replicas on several "
            "machines share.",
        ),
    ] = None,
    lease: Annotated[
        str | None,
        typer.Option(
            envvar="RECOVER_LEASE",
            help="Run as one replica of several, acting only while it holds the lease: "
            "journal (a row of the journal's database: the SQLite file of a shared state dir, "
            "or --journal-dsn's PostgreSQL) or "
            "kube (a coordination.k8s.io Lease; needs --kubeconfig or --in-cluster).",
        ),
    ] = None,
    replica_id: Annotated[
        str | None,
        typer.Option(
            envvar="POD_NAME",
            help="This replica's name in the lease [default: HOSTNAME-PID].",
        ),
    ] = None,
    lease_namespace: Annotated[
        str, typer.Option(envvar="RECOVER_LEASE_NAMESPACE", help="--lease kube: its namespace.")
    ] = "recover",
    lease_duration: Annotated[
        float,
        typer.Option(help="Seconds a standby waits on an unrenewed lease before taking it."),
    ] = DURATION_S,
    lease_renew_deadline: Annotated[
        float,
        typer.Option(help="Seconds after its last renewal that a leader stops acting."),
    ] = RENEW_DEADLINE_S,
    lease_retry: Annotated[
        float, typer.Option(help="Seconds between a replica's election rounds.")
    ] = RETRY_S,
) -> None:
    """Serve the intake API and act on health events until SIGTERM/SIGINT. With --lease,
    several replicas serve and the one holding the lease acts (docs/coordinator.md)."""
    from service.startup.serve import ServeOptions, run_coordinator
    from service.wiring import KubeOptions, LeaseOptions, SlurmAccess

    kube = None
    if kubeconfig is not None or in_cluster or slinky:
        kube = KubeOptions(
            kubeconfig=kubeconfig,
            in_cluster=in_cluster,
            namespace=k8s_namespace,
            pod_selector=k8s_pod_selector,
            taint_effect=k8s_taint_effect,
            pod_removal=k8s_pod_removal,
            slinky=slinky,
        )
    run_coordinator(
        ServeOptions(
            state_dir=state_dir,
            listen=listen,
            slurm_conf=slurm_conf,
            config=config,
            dry_run=dry_run,
            tick_s=tick,
            kube=kube,
            slurm_access=SlurmAccess(slurm_backend, slurmrestd, slurm_jwt_file, slurm_user),
            journal_dsn=journal_dsn,
            lease=None
            if lease is None
            else LeaseOptions(
                kind=lease,
                identity=replica_id or f"{socket.gethostname()}-{os.getpid()}",
                namespace=lease_namespace,
                duration_s=lease_duration,
                renew_deadline_s=lease_renew_deadline,
                retry_s=lease_retry,
            ),
        )
    )


@policy_app.command("replay")
def replay(
    journal: Annotated[Path, typer.Argument(help="A coordinator's journal.sqlite.")],
    config: Annotated[
        Path | None, typer.Option(help="The policy file to re-decide under [default: built-in].")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Re-decide a recorded event history under another policy; print what would differ.
    Applies no action."""
    from service.startup.replay_file import replay_journal

    diffs = replay_journal(journal, config)
    if as_json:
        typer.echo(json.dumps([d.to_json() for d in diffs], indent=2))
    elif not diffs:
        typer.echo("no difference: every event would be decided the same way")
    else:
        for d in diffs:
            typer.echo(d.summary())
        typer.echo(f"{len(diffs)} decision(s) would differ")
