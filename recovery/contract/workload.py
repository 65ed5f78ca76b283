"""A TPU workload registers itself on its node, so the node agent can tell a TPU runtime that
vanished under a running job (a fault) from one that went away because the job ended.

While ``recover train`` runs on TPUs it keeps a marker file named after its pid in
``$RECOVER_TPU_WORKLOAD_DIR`` (default :data:`DEFAULT_DIR`); it removes the marker when it
exits in any orderly way (done, preempted, an exception). A marker left behind means the
process died abruptly, which is exactly when a vanished runtime is a fault. The agent's TPU
source counts a workload as registered while any marker exists (``agents.tpu``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

ENV = "RECOVER_TPU_WORKLOAD_DIR"
DEFAULT_DIR = Path("/run/recover/tpu-workloads")


def workload_dir(environ: Mapping[str, str]) -> Path:
    """Where markers live: ``$RECOVER_TPU_WORKLOAD_DIR`` or :data:`DEFAULT_DIR`."""
    return Path(environ[ENV]) if environ.get(ENV) else DEFAULT_DIR


def any_registered(directory: Path) -> bool:
    """True while some TPU workload's marker is in ``directory`` (False when it is missing)."""
    try:
        return any(directory.iterdir())
    except OSError:
        return False


@contextlib.contextmanager
def registered(backend: str, directory: Path, pid: int | None = None) -> Iterator[Path | None]:
    """Hold a marker for this process in ``directory`` while on the ``tpu`` backend (nothing
    on other backends); yields the marker's path (None when none is kept). A directory that
    cannot be created only costs the marker, never the run."""
    if backend != "tpu":
        yield None
        return
    marker = directory / str(os.getpid() if pid is None else pid)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        marker.write_text("recover train\n")
    except OSError:
        yield None
        return
    try:
        yield marker
    finally:
        marker.unlink(missing_ok=True)
