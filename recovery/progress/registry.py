"""Where a node's agent finds the progress records of the training processes on its node, and
where it leaves the site's progress thresholds for them (:data:`SITE_FILE`).

A process that reports progress leaves a small entry in a node-local directory
(``$RECOVER_PROGRESS_REGISTRY``, default :data:`DEFAULT_REGISTRY`), named after its pid: its
record's path (in the run's progress directory, where every process of the job writes, so the
agent reads the job's other processes too), its node and its Slurm job. It removes the entry
when it ends in an orderly way; the agent removes an entry whose process is gone.

Registering may fail (no such directory, no permission): that costs only the watch, never the
run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_REGISTRY = "RECOVER_PROGRESS_REGISTRY"
DEFAULT_REGISTRY = Path("/run/recover/progress")
#: The site's progress thresholds (the coordinator's policy ``progress``), left in the
#: registry by the node's agent for what runs on the node without a coordinator of its own to
#: ask: an in-allocation job's supervisor.
SITE_FILE = "site-budgets.json"


def registry_dir(environ: Mapping[str, str]) -> Path:
    """``$RECOVER_PROGRESS_REGISTRY`` or :data:`DEFAULT_REGISTRY`."""
    return Path(environ[ENV_REGISTRY]) if environ.get(ENV_REGISTRY) else DEFAULT_REGISTRY


@dataclass(frozen=True)
class Entry:
    pid: int
    record: Path
    node: str
    job: str
    """The Slurm job id ('' outside Slurm)."""
    path: Path
    """The entry's own file."""


def register(registry: Path, record: Path, *, node: str, job: str, pid: int) -> Path | None:
    """Leave this process's entry; its path, or None when it cannot be written."""
    entry = registry / str(pid)
    body = json.dumps({"record": str(record.resolve()), "node": node, "job": job})
    try:
        registry.mkdir(parents=True, exist_ok=True)
        tmp = registry / f".{pid}.tmp"
        tmp.write_text(body)
        os.replace(tmp, entry)
    except OSError:
        return None
    return entry


def entries(registry: Path) -> list[Entry]:
    """The entries in ``registry`` (none when it is missing); unreadable ones are skipped."""
    out = []
    try:
        paths = sorted(registry.iterdir())
    except OSError:
        return []
    for path in paths:
        if not path.name.isdigit():
            continue
        try:
            data = json.loads(path.read_text())
            out.append(
                Entry(int(path.name), Path(data["record"]), str(data["node"]),
                      str(data.get("job", "")), path)
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def write_site_budgets(registry: Path, changes: Mapping[str, object]) -> bool:
    """Leave the site's thresholds in ``registry`` (atomically); False when they cannot be
    written (no such directory, no permission): the supervisor then judges by its defaults."""
    try:
        registry.mkdir(parents=True, exist_ok=True)
        tmp = registry / f".{SITE_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(dict(changes), sort_keys=True))
        os.replace(tmp, registry / SITE_FILE)
    except (OSError, TypeError, ValueError):
        return False
    return True


def read_site_budgets(registry: Path) -> dict[str, object] | None:
    """The site's thresholds the node's agent left in ``registry``; None when there are none
    (no agent, or one that never heard from a coordinator) or they cannot be read."""
    try:
        data = json.loads((registry / SITE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
