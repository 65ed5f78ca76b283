"""Helpers shared by the agent tests (imported, never copied between test modules)."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Longest a test waits for a condition another thread or process must bring about.
WAIT_S = 10.0


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Return once ``condition()`` holds; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)
