"""The composition root's builders: the one place that turns options and the environment into
adapters for the core's ports.

Every command that talks to Slurm (``recover cluster status/promote/retire``, ``recover
sbatch``, later the coordinator's start-up) finds its cluster here, the same way: an explicit
``--slurm-conf``, else ``$SLURM_CONF``, else the local cluster recorded in the state dir. The
environment comes in as a parameter, so tests control it. Adapters are imported inside the
functions so that importing this module (and ``recover --help``) stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recovery.errors import UsageError
from recovery.ports.nodes import NodeControl
from recovery.ports.slurm import SlurmControl

if TYPE_CHECKING:
    from recovery.service.process import Endpoint
    from slurm.cluster import ClusterStatus


def state_dir(explicit: Path | None, env: Mapping[str, str]) -> Path:
    """The local cluster's state dir: ``explicit`` (``--state-dir``) when given, else
    ``$RECOVER_STATE_DIR/slurm``, else ``./.state/slurm``; always absolute."""
    from slurm.cluster import default_state_dir

    return explicit.absolute() if explicit else default_state_dir(dict(env))


def slurm_conf(explicit: str | None, state: Path | None, env: Mapping[str, str]) -> Path:
    """The slurm.conf to use: ``explicit`` (``--slurm-conf``), else ``$SLURM_CONF`` from
    ``env``, else the conf of the local cluster recorded in ``state`` (see :func:`state_dir`).

    Raises UsageError saying how to provide one when there is none.
    """
    from slurm.cluster import resolve_conf

    return resolve_conf(explicit or env.get("SLURM_CONF") or None, state_dir(state, env))


def slurm_control(explicit: str | None, state: Path | None, env: Mapping[str, str]) -> SlurmControl:
    """The SlurmControl adapter for the cluster :func:`slurm_conf` resolves; its commands run
    with ``env`` (plus ``SLURM_CONF``). Raises UsageError when no cluster is configured."""
    from slurm.cli_slurm import CliSlurm

    return CliSlurm(slurm_conf(explicit, state, env), env=env)


def cluster_status(
    explicit: str | None, state: Path | None, env: Mapping[str, str]
) -> ClusterStatus:
    """What ``recover cluster status`` shows: the local cluster (its processes and nodes)
    unless ``--slurm-conf``/``$SLURM_CONF`` names another cluster's conf, whose nodes are
    shown alone (we started no process there)."""
    from slurm.cluster import LocalCluster, conf_status

    local = LocalCluster(state_dir(state, env))
    other = explicit or env.get("SLURM_CONF")
    if not other or Path(other).absolute() == local.conf_path:
        return local.status()
    return conf_status(Path(other).absolute(), env=env)


def coordinator_dir(cluster_state: Path) -> Path:
    """Where the local cluster's coordinator keeps its state: beside the cluster's state dir
    (``.state/slurm`` -> ``.state/coordinator``, the operator verbs' default)."""
    return cluster_state.parent / "coordinator"


def start_coordinator(cluster_state: Path, conf: Path) -> Endpoint:
    """Start the coordinator for the local cluster in the background (a no-op when one runs);
    returns where it listens. Raises CoordinatorUnavailableError with its log when it fails."""
    from recovery.service import process

    return process.start(coordinator_dir(cluster_state), slurm_conf=conf)


def stop_coordinator(cluster_state: Path) -> bool:
    """Stop the local cluster's coordinator; False when none ran."""
    from recovery.service import process

    return process.stop(coordinator_dir(cluster_state))


def start_agents(cluster_state: Path, endpoint: Endpoint, nodes: Sequence[str]) -> dict[str, int]:
    """One agent per node of the local cluster, each on its own kernel-log file, connected to
    ``endpoint``'s coordinator before this returns; node -> pid."""
    from recovery.service.agents_proc import start_agents as start
    from recovery.service.client import Client, admin_token
    from recovery.service.process import TOKENS_FILE

    d = coordinator_dir(cluster_state)
    client = Client(endpoint.url, admin_token(d / TOKENS_FILE))

    def connected() -> set[str]:
        return {a["node"] for a in client.get("/v1/agents") if a["connected"]}

    return start(d, nodes, endpoint.url, connected=connected)


def stop_agents(cluster_state: Path) -> list[str]:
    """Stop the local cluster's agents; returns the nodes whose agent was stopped."""
    from recovery.service.agents_proc import stop_agents as stop

    return stop(coordinator_dir(cluster_state))


@dataclass(frozen=True)
class KubeOptions:
    """How the coordinator reaches Kubernetes (``recover coordinator serve --kubeconfig`` or
    ``--in-cluster``) and where the slurmd pods are."""

    kubeconfig: Path | None = None
    """A kubeconfig file; None with ``in_cluster``: the pod's ServiceAccount."""
    in_cluster: bool = False
    namespace: str = "slurm"
    """Namespace of the slurmd pods."""
    pod_selector: str = "app.kubernetes.io/component=slurmd"
    """Label selector of the slurmd pods."""
    taint_effect: str = "NoSchedule"
    pod_removal: str = "delete"
    """``delete`` or ``evict`` (Eviction API)."""
    slinky: bool = False
    """Ask Slinky's slurm-operator to drain (pod annotation) instead of calling Slurm."""

    def __post_init__(self) -> None:
        if self.in_cluster and self.kubeconfig is not None:
            raise UsageError("Give either --kubeconfig PATH or --in-cluster, not both")
        if not self.in_cluster and self.kubeconfig is None:
            raise UsageError(
                "Kubernetes needs --kubeconfig PATH or --in-cluster (inside a pod with the "
                "recover-coordinator ServiceAccount)"
            )


def node_control(opts: KubeOptions) -> NodeControl:
    """The NodeControl adapter for the cluster ``opts`` names. Raises UsageError for a bad
    kubeconfig, an unknown taint effect or pod removal (naming the valid ones)."""
    from k8s.nodes import KubeControl, KubeSettings
    from k8s.transport import Transport, api_client

    settings = KubeSettings(
        namespace=opts.namespace,
        pod_selector=opts.pod_selector,
        taint_effect=opts.taint_effect,
        pod_removal=opts.pod_removal,
    )
    client = api_client(opts.kubeconfig, in_cluster=opts.in_cluster)
    return KubeControl(Transport(client, timeout_s=settings.timeout_s), settings)
