"""Where this process sits in a multi-process job: its rank, the process count and where
process 0 listens, read from the launcher's environment.

Two launchers are understood, in this order:

* our own variables, for any launcher (and for tests): ``RECOVER_NUM_PROCESSES`` and
  ``RECOVER_PROCESS_ID``;
* Slurm's, inside a job step started by ``srun``: ``SLURM_STEP_NUM_TASKS`` and
  ``SLURM_PROCID``. The batch step (the job script itself) is one process, whatever the
  job's node count: only ``srun`` starts several.

With more than one process, ``RECOVER_RENDEZVOUS=HOST:PORT`` names process 0's node (an
address the other nodes can reach: Slurm's ``NodeAddr``, since node names need not resolve)
and a free port on it; ``recover sbatch`` sets it in the batch script.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from recovery.errors import UsageError

#: Process count, for launchers other than srun (overrides Slurm's).
ENV_PROCESSES = "RECOVER_NUM_PROCESSES"
#: This process's rank, 0-based, with :data:`ENV_PROCESSES`.
ENV_PROCESS_ID = "RECOVER_PROCESS_ID"
#: ``HOST:PORT`` where process 0 listens for the others.
ENV_RENDEZVOUS = "RECOVER_RENDEZVOUS"
#: Names one launch when its processes are not one srun step (the job supervisor's warm
#: processes are one step each); otherwise the launch is named by Slurm's job and step ids.
ENV_GROUP = "RECOVER_GROUP"


@dataclass(frozen=True)
class Topology:
    """One process's place in its job."""

    rank: int
    """0-based; process 0 hosts the rendezvous and commits checkpoints."""
    size: int
    """Processes in the job (1: a single-process run, no group is formed)."""
    rendezvous: tuple[str, int] | None = None
    """``(host, port)`` where process 0 listens; None for a single process."""
    group_id: str = "local"
    """Identifies one launch (job, step, restart): a process of another launch that reaches
    the rendezvous by mistake is refused."""
    node: str | None = None
    """The node's name when the launcher says it (Slurm), for logs and events."""

    @property
    def multi(self) -> bool:
        return self.size > 1


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number") from None


def parse_address(text: str, *, what: str = ENV_RENDEZVOUS) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for an IPv6 literal) as ``(host, port)``.

    Raises:
        UsageError: not of that form, or a port outside 1-65535.
    """
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(
            f"{what}={text!r} is not HOST:PORT (an address process 0's node is reached at "
            "and a port from 1 to 65535), e.g. 10.0.0.7:29400"
        )
    return host, int(port)


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """This process's :class:`Topology` (see the module docstring for the variables read).

    Raises:
        UsageError: a count or rank that is not a number or out of range, one of the pair of
            ``RECOVER_*`` variables without the other, or several processes without
            ``RECOVER_RENDEZVOUS``; the message names the variables.
    """
    node = environ.get("SLURMD_NODENAME")
    if ENV_PROCESSES in environ or ENV_PROCESS_ID in environ:
        if not (ENV_PROCESSES in environ and ENV_PROCESS_ID in environ):
            raise UsageError(f"set both {ENV_PROCESSES} and {ENV_PROCESS_ID}, or neither")
        size, rank = _int(environ, ENV_PROCESSES), _int(environ, ENV_PROCESS_ID)
        source = f"{ENV_PROCESSES}/{ENV_PROCESS_ID}"
    elif "SLURM_STEP_ID" in environ and "SLURM_STEP_NUM_TASKS" in environ:
        size, rank = _int(environ, "SLURM_STEP_NUM_TASKS"), _int(environ, "SLURM_PROCID")
        source = "SLURM_STEP_NUM_TASKS/SLURM_PROCID"
    else:
        return Topology(rank=0, size=1, node=node)
    if size < 1 or not 0 <= rank < size:
        raise UsageError(f"{source} = {size}/{rank}: need a count >= 1 and 0 <= rank < count")
    if size == 1:
        return Topology(rank=0, size=1, node=node)
    if not environ.get(ENV_RENDEZVOUS):
        raise UsageError(
            f"{size} processes ({source}) but no {ENV_RENDEZVOUS}=HOST:PORT to meet at: "
            "set it to process 0's node address and a free port there "
            "(`recover sbatch` does this in its batch script)"
        )
    rendezvous = parse_address(environ[ENV_RENDEZVOUS])
    group_id = environ.get(ENV_GROUP) or ".".join(
        environ.get(k, "-") for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT")
    )
    return Topology(
        rank=rank,
        size=size,
        rendezvous=rendezvous,
        group_id=f"{group_id}@{rendezvous[1]}",
        node=node,
    )
