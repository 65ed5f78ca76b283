"""One writer per run: an ``flock`` on the checkpoint root."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
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

    def acquire(
        self,
        wait_s: float = 0.0,
        *,
        on_wait: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Take the lock, waiting up to ``wait_s`` seconds while another process holds it
        (``on_wait(holder_pid)`` is called once, when the wait starts).

        Why wait: the holder may be the training process of an earlier run on a node that
        hung. It is alive (frozen) until the node is power-cycled, and on shared storage its
        lock lasts until then or until the server's lease on it runs out; the requeued run
        may start before either.

        Raises RunLockedError, naming the holder's pid, if another process still holds it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = clock() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if clock() >= deadline:
                    os.close(fd)
                    waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
                    raise RunLockedError(
                        f"{self.root} is in use by another training process (pid {holder})"
                        f"{waited}; two writers would corrupt the run"
                    ) from None
                if not told and on_wait is not None:
                    on_wait(holder)
                told = True
                sleep(min(0.2, max(0.0, deadline - clock())))
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(
        self, wait_s: float = 0.0, *, on_wait: Callable[[str], None] | None = None
    ) -> Iterator[RunLock]:
        self.acquire(wait_s, on_wait=on_wait)
        try:
            yield self
        finally:
            self.release()
