"""The local cluster's records and paths: what ``up`` reports, what ``status`` shows, where
the state dir and slurm.conf are, and which programs must be installed. No daemons here."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recovery.errors import SlurmNotInstalledError, UsageError
from recovery.ports.slurm import NodeInfo, describe_state
from slurm.cli_slurm import INSTALL_HINT
from slurm.install import BUILD_HINT, SlurmInstall

REQUIRED_PROGRAMS = ("slurmctld", "slurmd", "munged", "sinfo", "squeue", "scontrol", "sbatch")
STATE_FILE = "cluster.json"


def default_state_dir(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """``$RECOVER_STATE_DIR/slurm`` when set, else ``./.state/slurm`` (absolute)."""
    env = os.environ if env is None else env
    base = Path(env["RECOVER_STATE_DIR"]) if env.get("RECOVER_STATE_DIR") else None
    root = base if base is not None else (cwd or Path.cwd()) / ".state"
    return (root / "slurm").absolute()


def resolve_conf(explicit: str | None, state_dir: Path) -> Path:
    """The slurm.conf to use: ``explicit`` (``--slurm-conf`` or ``$SLURM_CONF``) when given,
    else the local cluster's in ``state_dir``. Raises UsageError when there is neither."""
    if explicit:
        return Path(explicit).absolute()
    conf = state_dir / "slurm.conf"
    if (state_dir / STATE_FILE).exists() and conf.exists():
        return conf
    raise UsageError(
        f"No Slurm configuration: set SLURM_CONF (or --slurm-conf), or start the local "
        f"cluster with `recover cluster up` (looked in {state_dir})"
    )


def check_installed(
    install: SlurmInstall | None = None, which: Callable[[str], str | None] = shutil.which
) -> None:
    """Raise SlurmNotInstalledError naming the missing programs and how to install them.
    ``install`` is the Slurm the cluster runs on (None: Debian's, on PATH, looked up with
    ``which``); munged always comes from Debian's packages."""
    if install is None or install.prefix is None:
        missing = [p for p in REQUIRED_PROGRAMS if which(p) is None]
        if missing:
            raise SlurmNotInstalledError(f"missing {', '.join(missing)}; {INSTALL_HINT}")
        return
    missing = install.missing(tuple(p for p in REQUIRED_PROGRAMS if p != "munged"))
    if missing:
        raise SlurmNotInstalledError(
            f"missing {', '.join(missing)} in {install.describe()}; {BUILD_HINT}"
        )
    if which("munged") is None:
        raise SlurmNotInstalledError(f"missing munged; {INSTALL_HINT}")


#: Longest path a Unix socket may have (``sun_path`` holds 108 bytes, its NUL included).
SOCKET_PATH_MAX = 107


def longest_socket(state_dir: Path, names: Sequence[str]) -> Path:
    """The longest socket path slurmstepd may create in ``state_dir``'s spool: one per job
    step, ``spool/slurmd.NODE/NODE_JOBID.STEPID``; a batch step's id has 10 digits, and job
    ids are taken as up to 7."""
    node = max(names, key=len)
    return state_dir / "spool" / f"slurmd.{node}" / f"{node}_{'9' * 7}.4294967291"


def check_socket_paths(state_dir: Path, names: Sequence[str]) -> None:
    """Raise UsageError when ``state_dir`` is too deep for slurmstepd's sockets: every job
    launch on such a cluster fails ("Unix socket path ... is too long") and the job is
    requeued over and over."""
    longest = longest_socket(state_dir, names)
    if len(str(longest)) > SOCKET_PATH_MAX:
        room = SOCKET_PATH_MAX - (len(str(longest)) - len(str(state_dir)))
        raise UsageError(
            f"the state dir {state_dir} is too long for the Unix sockets slurmstepd creates in "
            f"it ({len(str(longest))} characters, at most {SOCKET_PATH_MAX}); choose one of at "
            f"most {room} characters"
        )


#: Most compute nodes and spares one local cluster may have.
MAX_NODES, MAX_SPARES = 512, 64


def node_names(nodes: int, spares: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Names for ``nodes`` compute nodes (node1..) and ``spares`` spares (spare1..).

    Raises UsageError for counts out of range (1-512 nodes, 0-64 spares: each slurmd takes
    about 7.4 MiB and a port; the storm benchmark runs 256 + 8).
    """
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"Invalid --nodes {nodes}: expected 1 to {MAX_NODES}")
    if not 0 <= spares <= MAX_SPARES:
        raise UsageError(f"Invalid --spares {spares}: expected 0 to {MAX_SPARES}")
    return (
        tuple(f"node{i}" for i in range(1, nodes + 1)),
        tuple(f"spare{i}" for i in range(1, spares + 1)),
    )


@dataclass(frozen=True)
class ClusterInfo:
    """A running cluster: where its conf is, its node names and the pids we started.

    ``started`` is False when ``up`` found it already healthy and did nothing.
    """

    state_dir: Path
    conf_path: Path
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    pids: dict[str, int]
    munge_home: Path
    started: bool = True

    @property
    def env(self) -> dict[str, str]:
        """The environment every Slurm command for this cluster needs."""
        return {"SLURM_CONF": str(self.conf_path)}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (paths as strings)."""
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


@dataclass(frozen=True)
class ClusterStatus:
    """What ``recover cluster status`` reports. ``nodes`` is empty when slurmctld is down."""

    state_dir: Path
    running: bool
    conf_path: Path | None = None
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: tuple[NodeInfo, ...] = ()
    error: str = ""

    def render(self) -> str:
        """Human-readable lines: processes, then one line per node."""
        if self.conf_path is None:
            return f"no cluster recorded in {self.state_dir}"
        lines = [
            f"cluster in {self.state_dir}: {'running' if self.running else 'NOT running'}",
            f"SLURM_CONF={self.conf_path}",
        ]
        lines += [
            f"  {k:<16} pid {v['pid']:<8} {'alive' if v['alive'] else 'dead'}"
            for k, v in self.processes.items()
        ]
        for n in self.nodes:
            lines.append(f"  {n.name:<10} {describe_state(n):<24} {n.reason}")
        if self.error:
            lines.append(f"  slurmctld: {self.error}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "state_dir": str(self.state_dir),
            "running": self.running,
            "conf_path": str(self.conf_path) if self.conf_path else None,
            "processes": self.processes,
            "nodes": [
                {
                    **asdict(n),
                    "flags": sorted(n.flags),
                    "features": sorted(n.features),
                    "partitions": list(n.partitions),
                }
                for n in self.nodes
            ],
            "error": self.error,
        }
