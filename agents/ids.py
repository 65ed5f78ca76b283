"""Stable event ids and the boot id they are scoped to.

An id is a digest of what identifies one observation (node, source, boot, and a source-specific
key such as the kernel's record sequence number), so re-reading the same observation after an
agent restart yields the same id and the coordinator drops it as a duplicate.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Where Linux publishes a random id that changes on every boot.
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
#: Hex digits of the digest kept in an id: 96 bits, collision-free for any realistic volume.
DIGEST_CHARS = 24


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This boot's id without dashes, or ``"noboot"`` where the file is absent (not Linux)."""
    try:
        return path.read_text().strip().replace("-", "") or "noboot"
    except OSError:
        return "noboot"


def event_id(node: str, source: str, boot_id: str, *key: object) -> str:
    """``<node>:<source>:<digest>``: a deterministic id for one observation.

    The result always matches :data:`recovery.model.events.EVENT_ID_PATTERN` for a valid node
    name (at most 63 + 1 + len(source) + 1 + 24 characters).
    """
    text = "\x1f".join(str(part) for part in (node, source, boot_id, *key))
    digest = hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{node}:{source}:{digest}"


def derived_id(base: str, suffix: str) -> str:
    """An id derived from another one (a deduplication summary of ``base``): ``base.suffix``,
    or a digest of both where that would exceed the 128 characters ids may have."""
    candidate = f"{base}.{suffix}"
    if len(candidate) <= 128:
        return candidate
    digest = hashlib.sha256(candidate.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{base[:100]}.{digest}"
