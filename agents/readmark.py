"""Where a kernel-log source has read up to, kept beside the agent's spool so that a restart
never reports the same kernel line twice.

A :class:`Mark` names the boot (its id) and a place in that boot's log: the ``/dev/kmsg``
record sequence number, a plain file's identity and byte offset, or a journal cursor. The
source notes the mark of each line that gave an event; the agent saves it (:class:`MarkFile`,
an atomic fsynced write) only once that event is in the spool or folded into an open
deduplication window, and at most every half second while lines keep coming. So after a crash
the log is read again from the last saved mark: lines after it are found again (their events
have stable ids, so whatever had already left is dropped by the coordinator), lines before it
are not read at all. A ``/dev/kmsg`` or journal mark of another boot is ignored: that log
starts afresh with every boot (a plain file's mark holds while it is the same file).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from recovery.fsutil import atomic_write

Log = Callable[[str], None]
#: The mark files in the spool directory, one per source.
MARK_FILES = {"kmsg": ".kmsg-mark.json", "journald": ".journald-mark.json"}


@dataclass(frozen=True)
class Mark:
    """A place in one boot's kernel log: after the record ``seq`` (``/dev/kmsg``), after byte
    ``offset`` of the file ``(dev, ino)`` (a plain file), or after the entry ``cursor``
    (journald). Fields that do not apply are None."""

    boot_id: str
    seq: int | None = None
    dev: int | None = None
    ino: int | None = None
    offset: int | None = None
    cursor: str | None = None


class MarkFile:
    """One source's saved mark. :meth:`note` the mark of each line as its event settles;
    :meth:`save` writes the newest one noted, if it changed (thread-safe). :meth:`hold` stops
    it where it is: an event that could not be spooled must be read again after a restart."""

    def __init__(self, path: Path, log: Log = print) -> None:
        self.path = path
        self._log = log
        self._lock = threading.Lock()
        self._noted: Mark | None = None
        self._saved: Mark | None = None
        self._held = False

    def load(self, boot_id: str) -> Mark | None:
        """The saved mark when it belongs to boot ``boot_id``; None when there is none, it is
        of another boot, or it is damaged (said in one log line; the log is then read from
        the start of the boot, and the coordinator drops what it already has)."""
        try:
            raw = json.loads(self.path.read_text())
            mark = Mark(**raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            self._log(f"agent: {self.path} is unreadable ({e}); reading this boot's log again")
            return None
        if mark.boot_id != boot_id:
            return None
        self._saved = mark
        return mark

    def note(self, mark: Mark) -> None:
        """Remember ``mark`` as the newest settled place (nothing is written yet); ignored
        once the mark is held."""
        with self._lock:
            if not self._held:
                self._noted = mark

    def hold(self) -> None:
        """Keep the mark before the line whose event could not be spooled, until the agent
        restarts (which reads that line again)."""
        with self._lock:
            if self._held:
                return
            self._held = True
        self._log(
            f"agent: an event could not be spooled; the read mark {self.path.name} stays where "
            "it is, so a restart reads its line again"
        )

    def save(self) -> bool:
        """Write the newest noted mark if it is not the one on disk; True when written.
        Raises OSError when the disk fails (the caller logs it and tries again later)."""
        with self._lock:
            mark = self._noted
            if mark is None or mark == self._saved:
                return False
            atomic_write(self.path, (json.dumps(asdict(mark)) + "\n").encode())
            self._saved = mark
            return True
