"""An on-disk spool of health events that loses nothing the agent has confirmed.

Commit points (each proved by tests/agents/test_spool_durability.py and test_spool_crash.py):

* :meth:`Spool.put` writes the event to ``.tmp-<seq>``, fsyncs the file, renames it to
  ``<seq>.json`` and fsyncs the directory; only then does it return True and may the event be
  sent. A crash before the rename leaves a temporary file that the next open deletes (that
  event was never confirmed); a crash after it leaves the event spooled.
* :meth:`Spool.ack` (the coordinator has committed the event) unlinks the file and fsyncs the
  directory. A crash in between may bring the event back after a restart: it is sent again and
  the coordinator, which deduplicates by id, acknowledges it again.

Files are named by a sequence number, so iteration for resend is in the order events were
spooled; an id already spooled is not written twice.

Bounds: ``max_events`` and ``max_bytes``. When full, the *newest* event is refused (``put``
returns False, ``dropped`` counts it, one log line per burst of drops). Why the newest: what is
already spooled was confirmed durable to the caller and is the start of an incident (the first
XID, which triggers the action); the upstream deduplicator already folds repeats, and
NVSentinel's users were hurt more by late floods than by missing tails. Dropping the oldest
would break the promise ``put`` made.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from recovery.model import HealthEvent

Log = Callable[[str], None]
SUFFIX = ".json"
TMP_PREFIX = ".tmp-"
BAD_PREFIX = ".bad-"
#: Default bounds: a day of a bad node's events with room to spare, a few MiB on disk.
DEFAULT_MAX_EVENTS = 10_000
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Spooled:
    """One spooled event and its position in the spool."""

    seq: int
    event: HealthEvent
    nbytes: int


class Spool:
    """Events waiting for the coordinator's acknowledgement, one fsynced file each.

    Thread-safe: sources may ``put`` while the sender iterates and acknowledges. Raises
    OSError where the disk fails (full, read-only): the caller must not report such an event as
    spooled.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        log: Log = print,
    ) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError(f"spool bounds must be >= 1, got {max_events} events, {max_bytes} B")
        self.directory = Path(directory)
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._log = log
        self._lock = threading.Lock()
        self._by_seq: dict[int, Spooled] = {}
        self._seq_of: dict[str, int] = {}
        self._bytes = 0
        self._next = 0
        #: Events refused because the spool was full, since this object was made.
        self.dropped = 0
        self._burst = 0
        self._load()

    # --- public --------------------------------------------------------------------------

    def put(self, event: HealthEvent) -> bool:
        """Make ``event`` durable. True once it is on stable storage (or was already spooled);
        False when the spool is full and it was dropped."""
        data = event.model_dump_json().encode()
        with self._lock:
            if event.id in self._seq_of:
                return True
            if len(self._by_seq) >= self.max_events or self._bytes + len(data) > self.max_bytes:
                self._drop(event)
                return False
            seq = self._next
            self._write(seq, data)
            self._next = seq + 1
            self._by_seq[seq] = Spooled(seq, event, len(data))
            self._seq_of[event.id] = seq
            self._bytes += len(data)
            if self._burst:
                self._log(
                    f"spool: {self._burst} events were dropped while full "
                    f"({self.dropped} since start); accepting events again"
                )
                self._burst = 0
            return True

    def ack(self, event_id: str) -> bool:
        """Forget an event the coordinator acknowledged; False if it was not spooled."""
        with self._lock:
            seq = self._seq_of.get(event_id)
            if seq is None:
                return False
            os.unlink(self._path(seq))
            self._fsync_dir()
            del self._seq_of[event_id]
            self._bytes -= self._by_seq.pop(seq).nbytes
            return True

    def pending(self, limit: int | None = None) -> list[Spooled]:
        """Spooled events in the order they were put (oldest first), at most ``limit``."""
        with self._lock:
            items = list(self._by_seq.values())
        return items if limit is None else items[:limit]

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_seq)

    def __contains__(self, event_id: object) -> bool:
        with self._lock:
            return event_id in self._seq_of

    @property
    def nbytes(self) -> int:
        """Bytes of spooled event data (the files' contents)."""
        with self._lock:
            return self._bytes

    # --- internals -----------------------------------------------------------------------

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:016d}{SUFFIX}"

    def _write(self, seq: int, data: bytes) -> None:
        tmp = self.directory / f"{TMP_PREFIX}{seq:016d}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self._path(seq))
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        _fsync_path(self.directory)

    def _drop(self, event: HealthEvent) -> None:
        self.dropped += 1
        self._burst += 1
        if self._burst == 1:  # one line per burst, not one per event
            self._log(
                f"spool: full ({len(self._by_seq)} events, {self._bytes} bytes; limits "
                f"{self.max_events} events, {self.max_bytes} bytes): dropping new events, "
                f"first {event.id} ({event.fault} on {event.node}), until the coordinator "
                "acknowledges some"
            )

    def _load(self) -> None:
        """Read what a previous run left: confirmed events stay, unconfirmed ones go."""
        if not self.directory.is_dir():
            os.makedirs(self.directory, exist_ok=True)
            _fsync_path(self.directory.parent)  # the new directory's own name is durable
        changed = False
        for name in sorted(os.listdir(self.directory)):
            path = self.directory / name
            if name.startswith(TMP_PREFIX):  # never renamed: never confirmed to anyone
                os.unlink(path)
                changed = True
                continue
            if not name.endswith(SUFFIX) or not name[: -len(SUFFIX)].isdigit():
                continue
            seq = int(name[: -len(SUFFIX)])
            data = path.read_bytes()
            try:
                event = HealthEvent.model_validate_json(data)
            except ValidationError as e:  # not ours to delete: keep it aside for a person
                os.rename(path, self.directory / f"{BAD_PREFIX}{name}")
                changed = True
                self._log(f"spool: {name} is not a valid event; kept as {BAD_PREFIX}{name}: {e}")
                continue
            self._next = max(self._next, seq + 1)
            if event.id in self._seq_of:  # cannot happen through put; keep the older copy
                os.unlink(path)
                changed = True
                continue
            self._by_seq[seq] = Spooled(seq, event, len(data))
            self._seq_of[event.id] = seq
            self._bytes += len(data)
        if changed:
            self._fsync_dir()


def _fsync_path(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
