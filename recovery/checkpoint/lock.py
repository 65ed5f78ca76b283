"""One writer per run: an ``flock`` on the checkpoint root."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from recovery.errors import RunLockedError


class RunLock:
    """Exclusive lock on a checkpoint root: one writer per run at a time.

    Uses ``flock`` on ``<root>/.lock``, which the kernel releases when the process dies, so a
    SIGKILLed run never leaves a stale lock behind.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises RunLockedError, naming the holder's pid, if another process holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLockedError(
                f"{self.root} is in use by another training process (pid {holder}); "
                "two writers would corrupt the run"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(self) -> Iterator[RunLock]:
        self.acquire()
        try:
            yield self
        finally:
            self.release()
