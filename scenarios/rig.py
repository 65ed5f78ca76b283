"""The cluster a scenario runs on: a local one the runner starts and stops (munge, slurmctld,
one slurmd per node, the coordinator, one agent per node), or an existing one it only talks to.

Everything is built through :mod:`recovery.wiring`, the way ``recover cluster up --agents``
builds it, so a scenario exercises the same start-up as an operator's test cluster.
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

from recovery import proc, statedir, wiring
from recovery.errors import CoordinatorUnavailableError, UsageError
from recovery.httpapi.client import Client, admin_token
from recovery.ports.slurm import SlurmControl
from recovery.spares import is_ready_spare
from scenarios.schema import ClusterSpec, ExistingCluster
from slurm.cli_slurm import CliSlurm
from slurm.cluster import LocalCluster
from slurm.clusterinfo import SOCKET_PATH_MAX, longest_socket, node_names

Log = Callable[[str], None]


@dataclass
class LocalParts:
    """The processes a local rig started, and how to break or stop them."""

    cluster: LocalCluster
    policy: Path | None

    @property
    def state(self) -> Path:
        return self.cluster.state_dir

    @property
    def coordinator_dir(self) -> Path:
        return wiring.coordinator_dir(self.state)

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
        return wiring.start_coordinator(
            self.state, self.cluster.conf_path, config=self.policy, listen=listen
        )

    def down(self) -> list[str]:
        """Stop agents, coordinator and cluster (each by pid); what was stopped."""
        stopped = [f"agent:{n}" for n in wiring.stop_agents(self.state)]
        if wiring.stop_coordinator(self.state):
            stopped.append("coordinator")
        return stopped + self.cluster.down()


@dataclass
class Rig:
    """What the runner acts on: Slurm, the coordinator, and the nodes as they were at start."""

    slurm: SlurmControl
    conf: Path
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
        """Stop what the runner started (nothing for an existing cluster)."""
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


def bring_up(spec: ClusterSpec, root: Path, log: Log) -> Rig:
    """Start a local cluster under ``root`` (Slurm state in ``root/slurm``, the coordinator's
    beside it), its coordinator with the scenario's policy, and one agent per node; return
    once every node is idle and every agent connected.

    Raises SlurmNotInstalledError, ClusterError (not root, a daemon failed) or
    CoordinatorUnavailableError; whatever started is stopped again before the error leaves.
    """
    t0 = time.monotonic()
    cluster = LocalCluster(
        root / "slurm", slurmd_timeout_s=spec.slurmd_timeout_s, cred_expire_s=spec.cred_expire_s
    )
    policy = None
    if spec.policy is not None:
        policy = root / "policy.yaml"
        root.mkdir(parents=True, exist_ok=True)
        policy.write_text(yaml.safe_dump(spec.policy, sort_keys=False))
    parts = LocalParts(cluster, policy)
    try:
        info = cluster.up(nodes=spec.nodes, spares=spec.spares)
        log(f"cluster up: nodes {', '.join(info.nodes)}; spares {', '.join(info.spares) or 'none'}"
            f" ({time.monotonic() - t0:.1f} s)")  # fmt: skip
        endpoint = parts.start_coordinator()
        wiring.start_agents(cluster.state_dir, endpoint, info.nodes + info.spares)
        log(f"coordinator at {endpoint.url}, one agent per node connected "
            f"({time.monotonic() - t0:.1f} s)")  # fmt: skip
        client = Client(endpoint.url, admin_token(endpoint.tokens_path))
    except BaseException:
        parts.down()
        raise
    return Rig(
        slurm=CliSlurm(info.conf_path),
        conf=info.conf_path,
        client=client,
        nodes=tuple(info.nodes),
        spares=tuple(info.spares),
        local=parts,
    )


def attach(spec: ExistingCluster, env: Mapping[str, str], log: Log) -> Rig:
    """Talk to a cluster that runs already: its slurm.conf, coordinator and admin token from
    ``spec`` or the environment. The job's candidates are the in-service nodes of
    ``spec.partition`` (every partition when None).

    Raises UsageError naming what is missing, CoordinatorUnavailableError when the
    coordinator does not answer.
    """
    conf = wiring.slurm_conf(spec.slurm_conf, None, env)
    url = spec.coordinator or env.get("RECOVER_COORDINATOR")
    tokens = spec.token_file or env.get("RECOVER_TOKEN_FILE")
    if not url or not tokens:
        raise UsageError(
            "an existing cluster needs the coordinator's URL and tokens file: set "
            "cluster.existing.coordinator and token_file, or $RECOVER_COORDINATOR and "
            "$RECOVER_TOKEN_FILE"
        )
    slurm = CliSlurm(conf, env=env)
    client = Client(url.rstrip("/"), admin_token(Path(tokens)))
    client.get("/v1/status")  # fails now, with the hint, rather than mid-scenario
    view = slurm.nodes()
    if spec.partition is not None:
        view = [n for n in view if spec.partition in n.partitions]
    nodes = tuple(sorted(n.name for n in view if n.in_service))
    spares = tuple(sorted(n.name for n in view if is_ready_spare(n)))
    if not nodes:
        raise UsageError(f"no node of {spec.partition or 'the cluster'} is in service")
    log(f"existing cluster ({conf}): nodes {', '.join(nodes)}; "
        f"spares {', '.join(spares) or 'none'}")  # fmt: skip
    return Rig(slurm=slurm, conf=conf, client=client, nodes=nodes, spares=spares)
