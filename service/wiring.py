"""The composition root's builders: the one place that turns options and the environment into
adapters for the core's ports (:class:`SlurmControl`, :class:`NodeControl`).

Every command that talks to Slurm (``recover cluster status/promote/retire``, ``recover
sbatch``, the coordinator's start-up, the scenario runner) finds its cluster here, the same
way: an explicit ``--slurm-conf``, else ``$SLURM_CONF``, else the local cluster recorded in the
state dir. The backend is a choice too (:class:`SlurmAccess`): Slurm's commands (``cli``, the
default) or slurmrestd (``rest``). Kubernetes is reached as :class:`KubeOptions` say
(:func:`node_control`). The environment comes in as a parameter, so tests control it.
Starting the local cluster's processes is :mod:`service.bringup`'s. Adapters are imported
inside the functions so that importing this module (and ``recover --help``) stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recovery.coordinator.leader import DURATION_S, RENEW_DEADLINE_S, RETRY_S
from recovery.errors import UsageError, unknown_choice
from recovery.ports.checks import BurnIn
from recovery.ports.lease import LeaseStore
from recovery.ports.nodes import NodeControl
from recovery.ports.slurm import SlurmControl

if TYPE_CHECKING:
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


#: The SlurmControl backends (``--slurm-backend``): Slurm's commands, slurmrestd, or
#: pyslurm (Slurm 25.11's C API in this process).
SLURM_BACKENDS = ("cli", "rest", "pyslurm")
#: The environment variables :class:`SlurmAccess` falls back on.
ACCESS_ENV = (
    "RECOVER_SLURM_BACKEND",
    "RECOVER_SLURMRESTD",
    "RECOVER_SLURM_JWT_FILE",
    "RECOVER_SLURM_USER",
    "RECOVER_SLURM",
)


@dataclass(frozen=True)
class SlurmAccess:
    """How to reach Slurm beyond its slurm.conf. A field left None falls back to its
    environment variable, then to the default (or, for slurmrestd, the local cluster's)."""

    backend: str | None = None
    """``cli`` or ``rest`` (``$RECOVER_SLURM_BACKEND``; default ``cli``)."""
    restd: str | None = None
    """slurmrestd as ``http(s)://HOST:PORT`` or ``unix:PATH`` (``$RECOVER_SLURMRESTD``;
    default: the one ``recover cluster up --rest`` started for the local cluster)."""
    jwt_file: str | None = None
    """File holding a JWT from ``scontrol token`` (``$RECOVER_SLURM_JWT_FILE``): sent to
    slurmrestd, or by the CLI backend as ``SLURM_JWT`` (no munge socket needed)."""
    user: str | None = None
    """The user the JWT was made for, sent to slurmrestd (``$RECOVER_SLURM_USER``)."""
    slurm: str | None = None
    """Which Slurm a local cluster started for the caller runs (``auto``, ``25.11``,
    ``22.05``; ``$RECOVER_SLURM``; default ``auto``, see :mod:`slurm.install`)."""

    def resolved(self, env: Mapping[str, str]) -> SlurmAccess:
        """Every unset field taken from ``env``; the backend checked. Raises UsageError
        naming the valid backends for an unknown one."""
        backend, restd, jwt_file, user, slurm = (env.get(name) or None for name in ACCESS_ENV)
        out = SlurmAccess(
            backend=self.backend or backend or "cli",
            restd=self.restd or restd,
            jwt_file=self.jwt_file or jwt_file,
            user=self.user or user,
            slurm=self.slurm or slurm,
        )
        if out.backend not in SLURM_BACKENDS:
            raise unknown_choice("Slurm backend", out.backend, SLURM_BACKENDS)
        return out


def slurm_control(
    explicit: str | None,
    state: Path | None,
    env: Mapping[str, str],
    access: SlurmAccess | None = None,
) -> SlurmControl:
    """The SlurmControl adapter ``access`` (resolved against ``env``) asks for: the CLI
    backend for the cluster :func:`slurm_conf` resolves, its commands run with ``env`` (plus
    ``SLURM_CONF``, and ``SLURM_JWT`` from the JWT file); or the REST backend (see
    :func:`rest_control`). Raises UsageError when no cluster is configured or the options do
    not fit together."""
    got = (access or SlurmAccess()).resolved(env)
    if got.backend == "rest":
        return rest_control(got, state, env)
    conf = slurm_conf(explicit, state, env)
    if got.backend == "pyslurm":
        from slurm.pyslurm_slurm import PySlurm

        return PySlurm(conf, env=env)
    from slurm.cli_slurm import CliSlurm

    return CliSlurm(conf, env=env, jwt_file=got.jwt_file)


def burn_in_runner(
    explicit: str | None,
    env: Mapping[str, str],
    access: SlurmAccess | None,
    workdir: Path,
    log: Callable[[str], None],
) -> BurnIn | None:
    """What runs node burn-ins as Slurm jobs (``slurm.burnin.SlurmBurnIn``): always through
    Slurm's commands (a reservation is asked with ``scontrol``), whichever backend the
    coordinator uses, for the cluster :func:`slurm_conf` resolves. None (said in ``log``)
    when no slurm.conf is found: node checks then skip the burn-in."""
    try:
        conf = slurm_conf(explicit, None, env)
    except UsageError as e:
        log(f"coordinator: node checks run no burn-in: {e}")
        return None
    from slurm.burnin import SlurmBurnIn
    from slurm.cli_slurm import CliSlurm

    got = (access or SlurmAccess()).resolved(env)
    return SlurmBurnIn(CliSlurm(conf, env=env, jwt_file=got.jwt_file), workdir, log=log)


def rest_control(access: SlurmAccess, state: Path | None, env: Mapping[str, str]) -> SlurmControl:
    """The REST backend for a resolved ``access``: its ``restd``, else the slurmrestd that
    ``recover cluster up --rest`` recorded for the local cluster in ``state`` (with its root
    token, unless a JWT file and user are given). Raises UsageError when there is neither."""
    from slurm.rest_slurm import RestSlurm

    where, jwt_file, user = access.restd, access.jwt_file, access.user
    local_state = state_dir(state, env)
    env = _job_env(local_state / "slurm.conf", env)
    if where is None:
        from slurm.restd import load_endpoint

        local = load_endpoint(local_state)
        if local is None:
            raise UsageError(
                "No slurmrestd configured: pass --slurmrestd http://HOST:PORT or unix:PATH "
                "(or set RECOVER_SLURMRESTD), or start the local cluster's with "
                "`recover cluster up --rest`"
            )
        where = local.url
        if jwt_file is None:
            jwt_file, user = str(local.token_file), user or local.user
    # The OpenAPI version (22.05's v0.0.38 or 25.11's v0.0.44) is asked of the daemon on first
    # use, so building the backend needs no daemon.
    if where.startswith("unix:"):
        return RestSlurm(
            socket=where.removeprefix("unix:"), token_file=jwt_file, user=user, env=env
        )
    return RestSlurm(url=where, token_file=jwt_file, user=user, env=env)


def _job_env(conf: Path, env: Mapping[str, str]) -> Mapping[str, str]:
    # A job submitted through slurmrestd gets this environment: on the local 25.11 cluster its
    # programs go first on PATH, so the job's own srun and scontrol match its slurmctld.
    from slurm import install

    try:
        inst = install.of_conf(conf)
    except UsageError:
        return env
    return install.command_env(inst, env)


def cluster_status(
    explicit: str | None, state: Path | None, env: Mapping[str, str]
) -> ClusterStatus:
    """What ``recover cluster status`` shows: the local cluster (its processes and nodes)
    unless ``--slurm-conf``/``$SLURM_CONF`` names another cluster's conf, whose nodes are
    shown alone (we started no process there)."""
    from slurm.cluster import LocalCluster, conf_status

    local = LocalCluster(state_dir(state, env), env=env)
    other = explicit or env.get("SLURM_CONF")
    if not other or Path(other).absolute() == local.conf_path:
        return local.status()
    return conf_status(Path(other).absolute(), env=env)


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


#: The kinds of lease ``recover coordinator serve --lease`` takes.
LEASE_KINDS = ("journal", "kube")


@dataclass(frozen=True)
class LeaseOptions:
    """Leader election among coordinator replicas (``recover coordinator serve --lease``)."""

    kind: str
    """``journal``: a row of the journal's database (SQLite: replicas sharing one state dir;
    PostgreSQL: replicas anywhere);
    ``kube``: a ``coordination.k8s.io`` Lease (needs --kubeconfig or --in-cluster)."""
    identity: str
    """This replica's name in the lease (unique among the replicas)."""
    namespace: str = "recover"
    """The Lease's namespace (``kube``)."""
    name: str = "recover-coordinator"
    duration_s: float = DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_s: float = RETRY_S

    def __post_init__(self) -> None:
        if self.kind not in LEASE_KINDS:
            raise unknown_choice("lease", self.kind, LEASE_KINDS)


def check_lease(opts: LeaseOptions, kube: KubeOptions | None) -> None:
    """UsageError for a lease the other options cannot reach (``kube`` without Kubernetes)."""
    if opts.kind == "kube" and kube is None:
        raise UsageError(
            "--lease kube needs Kubernetes: --kubeconfig PATH or --in-cluster "
            "(or --lease journal for replicas that share one state dir)"
        )


def lease_store(
    opts: LeaseOptions, kube: KubeOptions | None, journal: Path, journal_dsn: str | None = None
) -> LeaseStore:
    """Where the replicas' lease lives: for ``journal``, the PostgreSQL journal's database
    when ``journal_dsn`` is given, else the SQLite ``journal`` file. UsageError for ``kube``
    without Kubernetes options."""
    check_lease(opts, kube)
    if opts.kind == "journal":
        if journal_dsn:
            from service.journaldb.pglease import PgLease

            return PgLease(journal_dsn, opts.name, timeout_s=max(0.5, opts.renew_deadline_s / 2))
        from service.journaldb.lease import SqliteLease

        return SqliteLease(journal, opts.name)
    assert kube is not None
    from k8s.lease import KubeLease
    from k8s.transport import Transport, api_client

    # One try per request: the election asks again every round, and a renewal that hangs in
    # the client's own retries (4 x the timeout) would outlast the renew deadline.
    client = api_client(kube.kubeconfig, in_cluster=kube.in_cluster, retries=0)
    timeout_s = max(0.5, min(2.0, opts.renew_deadline_s / 2))
    return KubeLease(Transport(client, timeout_s=timeout_s), opts.namespace, opts.name)
