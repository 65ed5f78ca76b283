"""Where the memory tier keeps its copies (:mod:`recovery.api.memory`), with nothing but the
standard library: the local cluster empties a crashed node's copies without importing what
training needs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path

from recovery.errors import UsageError

#: Where node-local copies go unless ``--memory-dir`` / ``RECOVER_MEMORY_DIR`` says otherwise:
#: a tmpfs, one directory per user, made private (:func:`private_root`).
DEFAULT_ROOT = Path(f"/dev/shm/slurm-k8s-recover-{os.getuid()}")  # noqa: S108 (checked)
#: ``--memory-dir`` as the environment gives it.
ENV_MEMORY_DIR = "RECOVER_MEMORY_DIR"


def memory_root(environ: Mapping[str, str]) -> Path:
    """The root of node-local copies a process started with ``environ`` uses by default."""
    return Path(environ.get(ENV_MEMORY_DIR) or DEFAULT_ROOT)


def forget_node(root: Path, node: str) -> None:
    """Remove everything ``node`` keeps under ``root``: what a power cycle does to a tmpfs
    (the local cluster's simulated nodes share one host, so their crash must do it)."""
    if node and "/" not in node and node not in (".", ".."):
        shutil.rmtree(root / node, ignore_errors=True)


def node_name(environ: Mapping[str, str]) -> str:
    """This process's node as Slurm names it (the host name outside Slurm)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def node_key(node: str, slurm_conf: str | None) -> str:
    """The directory under the root that holds ``node``'s copies: the node's name, and the
    cluster's slurm.conf (a digest of its path) when the job names one (``SLURM_CONF``).
    Local clusters on one host name their simulated nodes alike (node1, node2, ...), and one
    cluster's crash of its node1 must not empty another's."""
    if not slurm_conf:
        return node
    digest = hashlib.sha256(os.path.realpath(slurm_conf).encode()).hexdigest()[:8]
    return f"{node}@{digest}"


def environ_node_key(environ: Mapping[str, str]) -> str:
    """:func:`node_key` of the process started with ``environ``."""
    return node_key(node_name(environ), environ.get("SLURM_CONF"))


def run_key(run_dir: Path) -> str:
    """A short name for ``run_dir`` (its absolute path's digest)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


def local_dir(root: Path, node: str, run_dir: Path, run_id: str) -> Path:
    """Where ``node`` keeps its copies of the run ``run_id`` in ``run_dir``."""
    for what, name in (("node name", node), ("run id", run_id)):
        if not name or "/" in name or name in (".", ".."):
            raise UsageError(f"invalid {what} {name!r} for the memory tier")
    return root / node / run_key(run_dir) / run_id


def private_root(root: Path) -> Path:
    """``root``, created readable by this user only if missing; refused when another user
    owns it (on a shared tmpfs another user could otherwise plant or read copies)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = root.stat().st_uid
    if owner != os.getuid():
        raise UsageError(
            f"{root} belongs to uid {owner}, not to this user ({os.getuid()}); "
            "pass --memory-dir (RECOVER_MEMORY_DIR) a directory of your own"
        )
    return root


RUN_ID_FILE = "run-id"


def run_id(run_dir: Path, *, fresh: bool) -> str:
    """The run's id, kept in ``RUN_DIR/run-id``: a new one when ``fresh`` (a start that
    refuses existing checkpoints) or none is there yet. Process 0 calls this before the
    others read it (:func:`read_run_id`)."""
    path = run_dir / RUN_ID_FILE
    if not fresh:
        try:
            existing = path.read_text().strip()
        except FileNotFoundError:
            existing = ""
        if existing:
            return existing
    new = os.urandom(8).hex()
    tmp = path.with_name(f".{RUN_ID_FILE}.{os.getpid()}")
    tmp.write_text(new + "\n")
    os.replace(tmp, path)
    return new


def read_run_id(run_dir: Path) -> str:
    """The id process 0 wrote (:func:`run_id`)."""
    return (run_dir / RUN_ID_FILE).read_text().strip()
