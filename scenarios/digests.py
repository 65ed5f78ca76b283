"""Control runs' digests: kept in a cache folder by key, read from a run's event log, and the
JAX compilation cache control runs and scenario jobs share. Used by the control run of
``recover train`` (:mod:`scenarios.control`) and of a command job
(:mod:`scenarios.command_job`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import recovery
from recovery import fsutil
from recovery.errors import RecoverError

_CODE = Path(recovery.__file__).resolve().parent


def code_fingerprint() -> str:
    """A digest of the training, checkpoint and library sources and the installed jax version."""
    h = hashlib.sha256()
    for sub in ("train", "checkpoint", "api"):
        for path in sorted((_CODE / sub).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    try:
        h.update(metadata.version("jax").encode())
    except metadata.PackageNotFoundError:
        h.update(b"no-jax")
    return h.hexdigest()[:16]


def cached_digest(
    cache: Path, key: str, produce: Callable[[Path], str], note: tuple[str, str]
) -> str:
    """The control digest cached in ``cache/key``; else ``produce(run_dir)`` runs once in a
    fresh folder beside it, and the digest is kept with ``note`` (file name, text: what was
    run). The run's own files are dropped. When two runs race, the first rename wins and
    both return its digest. Raises what ``produce`` raises."""
    d = cache / key
    cached = d / "digest"
    if cached.exists():
        return cached.read_text().strip()
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tmp-control-", dir=cache))
    try:
        run = work / "run"
        digest = produce(run)
        shutil.rmtree(run, ignore_errors=True)  # its checkpoints are not needed, only the digest
        fsutil.atomic_write(work / "digest", (digest + "\n").encode())
        fsutil.atomic_write(work / note[0], (note[1] + "\n").encode())
        try:
            os.rename(work, d)
        except OSError:
            if not cached.exists():  # not another run's rename that won: a real failure
                raise
        return cached.read_text().strip()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compile_cache(cache: Path) -> Path:
    """The JAX compilation cache shared by control runs and scenario jobs (same programs)."""
    return cache / "compile-cache"


def final_digest(events: Path) -> str:
    """The ``state_digest`` of the last ``completed`` event in ``events``."""
    try:
        lines = events.read_text().splitlines()
    except OSError as e:
        raise RecoverError(f"the run wrote no event log at {events} ({e})") from None
    for line in reversed(lines):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") == "completed" and doc.get("state_digest"):
            return str(doc["state_digest"])
    raise RecoverError(f"the run logged no completed event with a state_digest in {events}")
