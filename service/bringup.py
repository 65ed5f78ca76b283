"""The local cluster's bring-up and take-down, written once: ``recover cluster up`` / ``down``
and the scenario runner's local cluster (:mod:`scenarios.rig`) both call :func:`up` and
:func:`down`, so a scenario exercises the start-up an operator's test cluster gets.

In this order, each step a no-op when its part runs already: Slurm (munged, slurmctld, one
slurmd per node; :class:`slurm.cluster.LocalCluster`), slurmrestd (``rest``), the coordinator
(``coordinator``), one node agent per node (``agents``, which implies the coordinator). Every
process is started and stopped by pid and recorded in the state dirs: the cluster's (default
``.state/slurm``) and the coordinator's beside it (:func:`coordinator_dir`), which also holds
the agents' files. Adapters are imported inside the functions, as in :mod:`service.wiring`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery.errors import UsageError
from recovery.ports.slurm import SlurmControl
from recovery.statedir import Endpoint
from service import wiring

if TYPE_CHECKING:
    from slurm.cluster import ClusterInfo
    from slurm.restd import RestEndpoint


@dataclass(frozen=True)
class LocalSpec:
    """What to start (``recover cluster up``'s options; a scenario's ``cluster:``)."""

    nodes: int = 4
    """Compute nodes ``node1..nodeN``."""
    spares: int = 1
    """Spare nodes ``spare1..``, held drained in the pool."""
    slurmd_timeout_s: int = 10
    """Seconds before a silent slurmd's node goes DOWN."""
    cred_expire_s: int = 10
    """A requeued job waits this long (+1 s) before it may start again."""
    rest: bool = False
    """slurmctld also accepts JWTs, and slurmrestd runs (what ``--slurm-backend rest`` uses)."""
    coordinator: bool = False
    agents: bool = False
    """One agent per node (spares too); implies ``coordinator``."""
    policy: Path | None = None
    """The coordinator's policy file; None: the built-in policy."""
    slurm: str | None = None
    """Which Slurm (``auto``, ``25.11``, ``22.05``; None: ``$RECOVER_SLURM``, else ``auto``:
    25.11 when built). On 25.11 the cluster allows expedited requeue and runs our Epilog."""


@dataclass(frozen=True)
class LocalUp:
    """What runs after :func:`up`: the cluster, and slurmrestd, the coordinator and the agents
    when they were asked for."""

    info: ClusterInfo
    restd: RestEndpoint | None = None
    coordinator: Endpoint | None = None
    agents: Mapping[str, int] = field(default_factory=dict)
    """Node -> pid of its agent."""

    @property
    def state(self) -> Path:
        """The cluster's state dir."""
        return self.info.state_dir

    def to_json(self) -> dict[str, Any]:
        """What ``recover cluster up --json`` prints."""
        doc = self.info.to_json()
        if self.coordinator is not None:
            doc["coordinator"] = {
                "url": self.coordinator.url,
                "state_dir": str(self.coordinator.state_dir),
            }
        if self.restd is not None:
            doc["slurmrestd"] = self.restd.to_json()
        return doc

    def slurm_control(self, access: wiring.SlurmAccess, env: Mapping[str, str]) -> SlurmControl:
        """This cluster's SlurmControl with ``access``'s backend (resolved against ``env``),
        built by :func:`service.wiring.slurm_control`: for ``cli`` Slurm's commands on this
        cluster's slurm.conf (munge), for ``rest`` this cluster's slurmrestd with its root
        token. A slurm.conf, slurmrestd or JWT that ``env`` names belongs to another cluster
        and is not used; the rest of ``env`` is the commands' (and a submitted job's)
        environment. Raises UsageError for ``rest`` when slurmrestd was not started."""
        backend = access.resolved(env).backend
        local = wiring.SlurmAccess("cli")
        if backend == "rest":
            if self.restd is None:
                raise UsageError(
                    "the REST backend needs the local cluster's slurmrestd "
                    "(`recover cluster up --rest`)"
                )
            local = wiring.SlurmAccess(
                "rest", self.restd.url, str(self.restd.token_file), self.restd.user
            )
        if backend == "pyslurm":
            local = wiring.SlurmAccess("pyslurm")
        own = {k: v for k, v in env.items() if k not in wiring.ACCESS_ENV}
        return wiring.slurm_control(str(self.info.conf_path), self.state, own, local)


def _quiet(_: str) -> None:
    pass


def up(
    state: Path,
    spec: LocalSpec,
    *,
    log: Callable[[str], None] = _quiet,
    env: Mapping[str, str] | None = None,
) -> LocalUp:
    """Start the local cluster rooted at ``state`` as ``spec`` asks (see the module
    docstring); return once every node is idle (spares idle and drained), slurmrestd
    accepts connections, the coordinator answers and every agent has connected. ``log``
    gets one line as each part is up. ``env``: the environment every part starts with
    (None: this process's).

    Raises SlurmNotInstalledError (a program or the JWT plugin missing), UsageError (a
    different layout, or one without JWT, runs there already), ClusterError (not root, a
    daemon failed) or CoordinatorUnavailableError (the coordinator or an agent failed, with
    its log). A part that fails stops itself; the parts started before it keep running
    (:func:`down` stops them).
    """
    from slurm import install
    from slurm.cluster import LocalCluster

    inst = install.choose(spec.slurm, env)
    expedite = inst.series >= (25, 11)
    cluster = LocalCluster(
        state,
        slurmd_timeout_s=spec.slurmd_timeout_s,
        cred_expire_s=spec.cred_expire_s,
        jwt=spec.rest,
        install=inst,
        expedite=expedite,
        epilog=epilog_command(coordinator_dir(state)) if expedite else None,
        env=env,
    )
    info = cluster.up(nodes=spec.nodes, spares=spec.spares)
    log(
        f"cluster up on {inst.describe()}: nodes {', '.join(info.nodes)}; "
        f"spares {', '.join(info.spares) or 'none'}"
    )
    restd = None
    if spec.rest:
        restd = cluster.start_rest()
        log(f"slurmrestd at {restd.url} and unix:{restd.socket}")
    endpoint = None
    if spec.coordinator or spec.agents:
        endpoint = start_coordinator(info.state_dir, info.conf_path, config=spec.policy, env=env)
        log(f"coordinator at {endpoint.url}")
    agents: dict[str, int] = {}
    if spec.agents and endpoint is not None:
        agents = start_agents(info.state_dir, endpoint, info.nodes + info.spares, env=env)
        log("one agent per node, connected")
    return LocalUp(info, restd, endpoint, agents)


def down(state: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """Stop the agents, the coordinator and the cluster (slurmrestd with it) recorded for
    ``state``, each by pid; returns what was running (``agent:NODE``, ``coordinator``, the
    cluster's daemons). ``env``: the environment the cluster started with (None: this
    process's), whose memory-tier root loses the nodes' copies. A no-op on a cluster that
    is not running."""
    from slurm.cluster import LocalCluster

    stopped = [f"agent:{n}" for n in stop_agents(state)]
    if stop_coordinator(state):
        stopped.append("coordinator")
    return stopped + LocalCluster(state, env=env).down()


def epilog_command(coordinator: Path) -> list[str]:
    """The Epilog slurmd runs after each job (``agents/epilog.py``, standard library only):
    it fails while the node has an open incident in the coordinator recorded in
    ``coordinator`` (its state dir), which makes Slurm requeue an expedited job at once.
    Run with the system's python3 (``-I``: nothing from this virtualenv), as on a node where
    the toolkit is not installed."""
    from agents import epilog

    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    return [python, "-I", epilog.__file__, "--coordinator-dir", str(coordinator)]


def coordinator_dir(cluster_state: Path) -> Path:
    """Where the local cluster's coordinator keeps its state: beside the cluster's state dir
    (``.state/slurm`` -> ``.state/coordinator``, the operator verbs' default)."""
    return cluster_state.parent / "coordinator"


def start_coordinator(
    cluster_state: Path,
    conf: Path,
    *,
    config: Path | None = None,
    listen: str = "127.0.0.1:0",
    env: Mapping[str, str] | None = None,
) -> Endpoint:
    """Start the coordinator for the local cluster in the background (a no-op when one runs);
    returns where it listens. ``config``: its policy file; ``listen``: host:port (port 0: any
    free one). It reaches Slurm through Slurm's commands on ``conf`` whatever
    ``$RECOVER_SLURM_BACKEND`` says: slurmrestd 22.05 can neither drain nor requeue, and a
    backend in the environment is meant for the caller's own commands. ``env``: the
    environment it starts with (None: this process's). Raises CoordinatorUnavailableError
    with its log when it fails."""
    from service.daemons import coordinator as coordinator_proc

    return coordinator_proc.start(
        coordinator_dir(cluster_state),
        slurm_conf=conf,
        config=config,
        listen=listen,
        extra_args=("--slurm-backend", "cli"),
        env=env,
    )


def stop_coordinator(cluster_state: Path) -> bool:
    """Stop the local cluster's coordinator; False when none ran."""
    from service.daemons import coordinator as coordinator_proc

    return coordinator_proc.stop(coordinator_dir(cluster_state))


def start_agents(
    cluster_state: Path,
    endpoint: Endpoint,
    nodes: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """One agent per node of the local cluster, each on its own kernel-log file, connected to
    ``endpoint``'s coordinator before this returns; node -> pid. ``env``: the environment
    they start with (None: this process's)."""
    from service.daemons.agents import start_agents as start
    from service.httpapi.client import Client, admin_token

    d = coordinator_dir(cluster_state)
    client = Client(endpoint.url, admin_token(endpoint.tokens_path))

    def connected() -> set[str]:
        return {a["node"] for a in client.get("/v1/agents") if a["connected"]}

    return start(d, nodes, endpoint.url, env=env, connected=connected)


def stop_agents(cluster_state: Path) -> list[str]:
    """Stop the local cluster's agents; returns the nodes whose agent was stopped."""
    from service.daemons.agents import stop_agents as stop

    return stop(coordinator_dir(cluster_state))
