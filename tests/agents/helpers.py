"""Helpers shared by the agent tests (imported, never copied between test modules)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.model import HealthEvent, Source

#: Longest a test waits for a condition another thread or process must bring about.
WAIT_S = 30.0


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Return once ``condition()`` holds; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


# --- stand-ins for ``os`` that record or interrupt the spool's system calls -----------------

Op = tuple[str, Path, Path | None]


class TracingOs:
    """Forwards to ``os``, recording open/write/fsync/rename/unlink with the paths involved
    (fsync and write get a descriptor; the path comes from the open that returned it)."""

    def __init__(self) -> None:
        self.trace: list[Op] = []
        self._paths: dict[int, Path] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        fd = os.open(path, flags, mode)
        self._paths[fd] = Path(path)
        self.trace.append(("open", Path(path), None))
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        os.close(fd)

    def write(self, fd: int, data: Any) -> int:
        self.trace.append(("write", self._paths[fd], None))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        self.trace.append(("fsync", self._paths[fd], None))

    def rename(self, src: Any, dst: Any) -> None:
        os.rename(src, dst)
        self.trace.append(("rename", Path(src), Path(dst)))

    def unlink(self, path: Any) -> None:
        os.unlink(path)
        self.trace.append(("unlink", Path(path), None))

    def index(self, op: str, path: Path, dst: Path | None = None, *, after: int = -1) -> int:
        """Position of the first ``(op, path, dst)`` after position ``after``."""
        for i, entry in enumerate(self.trace):
            if i > after and entry == (op, path, dst):
                return i
        raise AssertionError(f"no {op} {path} {dst or ''} after #{after} in trace:\n{self}")

    def __str__(self) -> str:
        return "\n".join(f"  #{i} {op} {a} {b or ''}" for i, (op, a, b) in enumerate(self.trace))


def make_event(n: int, *, node: str = "gpu-n3", fault: str = "xid79", size: int = 0) -> HealthEvent:
    """Event number ``n``: id ``<node>:test:<n>``, content a function of ``n``; ``size`` pads
    the message to make it that many characters."""
    return HealthEvent(
        id=f"{node}:test:{n:08d}",
        node=node,
        source=Source.kmsg,
        fault=fault,
        accelerator=n % 8,
        observed_at=1.8e9 + n,
        message=(f"event {n} " * (1 + size // 8))[:size] if size else f"event {n}",
    )


def case_lines(case: dict[str, Any]) -> list[str]:
    """The kernel-log lines of a table row (``line``, or ``lines`` for a split message)."""
    return list(case["lines"]) if "lines" in case else [case["line"]]


def case_wanted(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The faults a table row must give (``want``: none, one, or a list)."""
    want = case["want"]
    if want is None:
        return []
    return list(want) if isinstance(want, list) else [want]
