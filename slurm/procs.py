"""Starting and stopping the local cluster's daemons by pid, without leaving anything behind.

Daemons are started in the foreground (``-D``/``-F``) in their own session with
``posix_spawn``, so the pid we record is the daemon itself. Each carries an environment marker
(:data:`MARKER_ENV` = the cluster's state dir); ``slurmstepd`` inherits slurmd's environment,
and job processes are its descendants, so "marked processes and their descendants" is exactly
what a cluster started - never a process of another cluster or of the user's shell.

Slurm 25.11's slurmstepd writes its process title over its environment, so the marker cannot
be read there; such a step is known instead by the files it holds open in the cluster's state
dir (its node's slurmd log, its spool), and only a process named ``slurmstepd`` is looked at
that way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from recovery.proc import alive, parent_of, spawn, stat

__all__ = ["MARKER_ENV", "NODE_ENV", "alive", "cluster_processes", "parent_of", "spawn", "stop"]

#: Environment variable set on every daemon we start; its value is the cluster's state dir.
MARKER_ENV = "RECOVER_SLURM_CLUSTER"
#: Set on each slurmd (and so on its job steps): the node it serves.
NODE_ENV = "RECOVER_SLURM_NODE"

_PROC = Path("/proc")


def _environ_has(pid: int, entries: set[bytes]) -> bool:
    try:
        data = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return entries <= set(data.split(b"\0"))


def _job_process_of(pid: int, conf_entry: bytes) -> bool:
    """Whether ``pid`` runs in a Slurm job of the cluster whose ``SLURM_CONF=...`` entry is
    ``conf_entry``: a job's processes carry the job's environment (``SLURM_JOB_ID`` and the
    ``SLURM_CONF`` it was submitted with), not the daemons' marker."""
    try:
        data = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    entries = data.split(b"\0")
    return conf_entry in entries and any(e.startswith(b"SLURM_JOB_ID=") for e in entries)


def _comm(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _holds_open(pid: int, marker: str, node: str | None) -> bool:
    """Whether ``pid`` holds a file open under the state dir ``marker`` (for ``node``: one of
    that node's, whose paths name ``slurmd.<node>``)."""
    prefix = marker.rstrip("/") + "/"
    try:
        fds = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if not target.startswith(prefix):
            continue
        if node is None or f"slurmd.{node}." in target or f"slurmd.{node}/" in target:
            return True
    return False


def cluster_processes(
    marker: str, roots: Iterable[int] = (), *, node: str | None = None
) -> set[int]:
    """Pids of live processes carrying ``MARKER_ENV=marker`` (and ``NODE_ENV=node`` when
    ``node`` is given), the given ``roots``, and all their descendants; never this process or
    its ancestors. For the whole cluster (no ``node``), also the processes of its jobs
    (``SLURM_JOB_ID`` with ``SLURM_CONF=<marker>/slurm.conf``), wherever they hang: a job
    step's task whose slurmstepd died first (or was never recognised) is no descendant of
    anything found."""
    entry = {f"{MARKER_ENV}={marker}".encode()}
    job_conf = f"SLURM_CONF={marker}/slurm.conf".encode() if node is None else None
    if node is not None:
        entry.add(f"{NODE_ENV}={node}".encode())
    parents: dict[int, int] = {}
    found: set[int] = set()
    for p in _PROC.iterdir():
        if not p.name.isdigit():
            continue
        pid = int(p.name)
        st = stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        parents[pid] = st[1]
        if (
            _environ_has(pid, entry)
            or (job_conf is not None and _job_process_of(pid, job_conf))
            or (_comm(pid) == "slurmstepd" and _holds_open(pid, marker, node))
        ):
            found.add(pid)
    found |= {r for r in roots if r in parents}
    # Descendants: repeat until no new child of a found process appears.
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    protected = set()
    pid = os.getpid()
    while pid > 1 and pid not in protected:
        protected.add(pid)
        pid = parents.get(pid, 1)
    return found - protected


def stop(
    pids: Iterable[int],
    *,
    kill_now: Iterable[int] = (),
    grace_s: float = 6.0,
    poll_s: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """SIGTERM every pid in ``pids`` and SIGKILL every pid in ``kill_now``, all at once; wait
    up to ``grace_s`` seconds, then SIGKILL what is left.

    Returns the pids that had to be killed after the grace period. Pids that vanish on the
    way are fine.
    """
    targets = {p for p in pids if alive(p)}
    doomed = {p for p in kill_now if alive(p)}
    for p in targets - doomed:
        _signal(p, signal.SIGTERM)
    for p in doomed:
        _signal(p, signal.SIGKILL)
    targets |= doomed
    deadline = clock() + grace_s
    while clock() < deadline:
        targets = {p for p in targets if alive(p)}
        if not targets:
            return []
        sleep(poll_s)
    killed = sorted(p for p in targets if alive(p))
    for p in killed:
        _signal(p, signal.SIGKILL)
    deadline = clock() + 2.0
    while clock() < deadline and any(alive(p) for p in killed):
        sleep(poll_s)
    return killed


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
