"""The cluster a scenario runs on: a local one the runner starts and stops (munge, slurmctld,
one slurmd per node, slurmrestd for the REST backend, the coordinator, one agent per node), or
an existing one it only talks to.

The local cluster comes up through :func:`service.bringup.up`, the bring-up of ``recover
cluster up --agents``, so a scenario exercises the same start-up as an operator's test
cluster; Slurm is reached through :func:`service.wiring.slurm_control` with the backend the
run asked for (``recover scenario run --slurm-backend``).
"""

from __future__ import annotations

import hashlib
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from recovery import proc, statedir
from recovery.errors import CoordinatorUnavailableError, UsageError
from recovery.pool.spares import is_ready_spare
from recovery.ports.slurm import SlurmControl
from scenarios.schema import ClusterSpec, ExistingCluster
from service import bringup, wiring
from service.httpapi.client import Client, admin_token
from slurm.cluster import LocalCluster
from slurm.clusterinfo import SOCKET_PATH_MAX, longest_socket, node_names

Log = Callable[[str], None]


@dataclass
class LocalParts:
    """The processes a local rig started, and how to break or stop them."""

    state: Path
    """The cluster's state dir (the coordinator's is beside it)."""
    policy: Path | None
    env: Mapping[str, str] | None = None
    """The environment the parts started with (None: this process's): a crashed node loses
    the memory-tier copies under its ``RECOVER_MEMORY_DIR``."""

    @property
    def cluster(self) -> LocalCluster:
        return LocalCluster(self.state, env=self.env)

    @property
    def coordinator_dir(self) -> Path:
        return bringup.coordinator_dir(self.state)

    def kill_coordinator(self, *, timeout_s: float = 10.0) -> int:
        """SIGKILL the coordinator (no shutdown of any kind); returns its pid once it is gone.
        Raises CoordinatorUnavailableError when none runs."""
        ep = statedir.read_endpoint(self.coordinator_dir)
        if ep is None or not proc.alive(ep.pid):
            raise CoordinatorUnavailableError(f"no coordinator runs in {self.coordinator_dir}")
        os.kill(ep.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while proc.alive(ep.pid):
            if time.monotonic() > deadline:
                raise CoordinatorUnavailableError(f"coordinator {ep.pid} survived SIGKILL")
            time.sleep(0.02)
        return ep.pid

    def start_coordinator(self, listen: str = "127.0.0.1:0") -> statedir.Endpoint:
        """Start the coordinator (again) with the scenario's policy, listening on ``listen``."""
        return bringup.start_coordinator(
            self.state, self.cluster.conf_path, config=self.policy, listen=listen, env=self.env
        )

    def down(self) -> list[str]:
        """Stop agents, coordinator and cluster (each by pid); what was stopped."""
        return bringup.down(self.state, self.env)


@dataclass
class Rig:
    """What the runner acts on: Slurm, the coordinator, and the nodes as they were at start."""

    slurm: SlurmControl
    """Slurm through the backend the run asked for (``--slurm-backend``)."""
    client: Client
    nodes: tuple[str, ...]
    """Nodes in service at start (the job's candidates), sorted."""
    spares: tuple[str, ...]
    """Ready spares at start."""
    local: LocalParts | None = None

    def need_local(self, what: str) -> LocalParts:
        """The local parts, or UsageError saying ``what`` needs the local cluster."""
        if self.local is None:
            raise UsageError(f"{what} needs the local cluster the runner starts itself")
        return self.local

    def down(self) -> list[str]:
        """Stop what the runner started (nothing for an existing cluster); close the
        connection the REST backend keeps to slurmrestd."""
        close = getattr(self.slurm, "close", None)
        if callable(close):
            close()
        return self.local.down() if self.local is not None else []


def cluster_root(out: Path, spec: ClusterSpec) -> Path:
    """Where the local cluster's state goes: ``out/cluster``, unless slurmstepd's sockets
    would be too long there (a deep run directory), then a short folder in the temp dir that
    the runner moves into ``out/cluster`` once the cluster is down."""
    names, spares = node_names(spec.nodes, spec.spares)
    preferred = out / "cluster"
    if len(str(longest_socket(preferred / "slurm", names + spares))) <= SOCKET_PATH_MAX:
        return preferred
    digest = hashlib.sha256(str(out).encode()).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"recover-scenario-{digest}"
    if short.exists():
        raise UsageError(
            f"{short} is left from an earlier run into {out} that did not finish; stop what "
            f"runs there (`recover cluster down --state-dir {short / 'slurm'}`) and remove it"
        )
    return short


def local_spec(
    spec: ClusterSpec, backend: str, policy: Path | None, slurm: str | None = None
) -> bringup.LocalSpec:
    """What :func:`bring_up` asks :func:`service.bringup.up` for: ``spec``'s cluster on the
    Slurm ``slurm`` names (``--slurm``), its coordinator with ``policy`` and one agent per
    node, and slurmrestd when the run reaches Slurm through it (``backend`` ``rest``)."""
    return bringup.LocalSpec(
        nodes=spec.nodes, spares=spec.spares, slurmd_timeout_s=spec.slurmd_timeout_s,
        cred_expire_s=spec.cred_expire_s, rest=backend == "rest", coordinator=True,
        agents=True, policy=policy, slurm=slurm,
    )  # fmt: skip


def bring_up(
    spec: ClusterSpec,
    root: Path,
    log: Log,
    access: wiring.SlurmAccess | None = None,
    env: Mapping[str, str] | None = None,
) -> Rig:
    """Start a local cluster under ``root`` (Slurm state in ``root/slurm``, the coordinator's
    beside it) through :func:`service.bringup.up`, as ``recover cluster up --agents`` does:
    its coordinator with the scenario's policy, one agent per node, and slurmrestd when
    ``access`` (resolved against ``env``, default the process's) asks for the REST backend,
    every part started with ``env``; return once every node is idle and every agent
    connected. The rig reaches Slurm through ``access``'s backend
    (:meth:`service.bringup.LocalUp.slurm_control`).

    Raises UsageError (an unknown backend, before anything starts), SlurmNotInstalledError,
    ClusterError (not root, a daemon failed) or CoordinatorUnavailableError; whatever started
    is stopped again before the error leaves.
    """
    env = os.environ if env is None else env
    access = access or wiring.SlurmAccess()
    backend = access.resolved(env).backend or "cli"
    t0 = time.monotonic()
    policy = None
    if spec.policy is not None:
        policy = root / "policy.yaml"
        root.mkdir(parents=True, exist_ok=True)
        policy.write_text(yaml.safe_dump(spec.policy, sort_keys=False))
    parts = LocalParts(root / "slurm", policy, env)

    def timed(line: str) -> None:
        log(f"{line} ({time.monotonic() - t0:.1f} s)")

    try:
        version = access.resolved(env).slurm
        up = bringup.up(parts.state, local_spec(spec, backend, policy, version), log=timed, env=env)
        assert up.coordinator is not None  # asked for: LocalSpec(agents=True)
        slurm = up.slurm_control(access, env)
        client = Client(up.coordinator.url, admin_token(up.coordinator.tokens_path))
    except BaseException:
        parts.down()
        raise
    return Rig(
        slurm=slurm,
        client=client,
        nodes=tuple(up.info.nodes),
        spares=tuple(up.info.spares),
        local=parts,
    )


def attach(
    spec: ExistingCluster,
    env: Mapping[str, str],
    log: Log,
    access: wiring.SlurmAccess | None = None,
) -> Rig:
    """Talk to a cluster that runs already: its Slurm through :func:`service.wiring.
    slurm_control` with ``access`` (its slurm.conf from ``spec`` or ``$SLURM_CONF``), its
    coordinator and admin token from ``spec`` or the environment. The job's candidates are
    the in-service nodes of ``spec.partition`` (every partition when None).

    Raises UsageError naming what is missing, CoordinatorUnavailableError when the
    coordinator does not answer.
    """
    access = access or wiring.SlurmAccess()
    slurm = wiring.slurm_control(spec.slurm_conf, None, env, access)
    url = spec.coordinator or env.get("RECOVER_COORDINATOR")
    tokens = spec.token_file or env.get("RECOVER_TOKEN_FILE")
    if not url or not tokens:
        raise UsageError(
            "an existing cluster needs the coordinator's URL and tokens file: set "
            "cluster.existing.coordinator and token_file, or $RECOVER_COORDINATOR and "
            "$RECOVER_TOKEN_FILE"
        )
    client = Client(url.rstrip("/"), admin_token(Path(tokens)))
    client.get("/v1/status")  # fails now, with the hint, rather than mid-scenario
    view = slurm.nodes()
    if spec.partition is not None:
        view = [n for n in view if spec.partition in n.partitions]
    nodes = tuple(sorted(n.name for n in view if n.in_service))
    spares = tuple(sorted(n.name for n in view if is_ready_spare(n)))
    if not nodes:
        raise UsageError(f"no node of {spec.partition or 'the cluster'} is in service")
    log(f"existing cluster (Slurm through {access.resolved(env).backend}): nodes "
        f"{', '.join(nodes)}; spares {', '.join(spares) or 'none'}")  # fmt: skip
    return Rig(slurm=slurm, client=client, nodes=nodes, spares=spares)
