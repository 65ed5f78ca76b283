"""Helpers for the unit tests: a stand-in for ``os`` that records the order of system calls."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

Op = tuple[str, Path, Path | None]
"""``(call, path, destination)``; the destination only for a rename or an exchange."""


class TracingOs:
    """Forwards to ``os``, recording open/fsync/rename with the paths involved.

    fsync gets a file descriptor; the path comes from the open that returned it. The mapping
    is dropped *before* the real close, so a descriptor number reused by another thread is
    never attributed to the old path.
    """

    def __init__(self) -> None:
        self.trace: list[Op] = []
        self._paths: dict[int, Path] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        fd = os.open(path, flags, mode, **kwargs)
        with self._lock:
            self._paths[fd] = Path(path)
            self.trace.append(("open", Path(path), None))
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        os.close(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        with self._lock:
            self.trace.append(("fsync", self._paths[fd], None))

    def rename(self, src: Any, dst: Any) -> None:
        os.rename(src, dst)
        with self._lock:
            self.trace.append(("rename", Path(src), Path(dst)))

    def index(self, op: str, path: Path, dst: Path | None = None, *, after: int = -1) -> int:
        for i, entry in enumerate(self.trace):
            if i > after and entry == (op, path, dst):
                return i
        raise AssertionError(f"no {op} {path} {dst or ''} after #{after} in trace:\n{self}")

    def __str__(self) -> str:
        return "\n".join(f"  #{i} {op} {a} {b or ''}" for i, (op, a, b) in enumerate(self.trace))
