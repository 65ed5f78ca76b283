"""Retry with exponential backoff for transient errors, and only for them.

A :class:`recovery.errors.TransientError` (slurmctld unreachable, a timeout) may succeed later;
every other error is a verdict and is raised at once, because asking again gives the same
answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from recovery.errors import TransientError, UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How to wait between attempts.

    ``attempts`` counts every call including the first; waits (seconds) grow from
    ``initial_s`` by ``factor`` up to ``max_s``, and never fall below the error's own
    ``delay`` hint when ``honour_hint`` is set.
    """

    attempts: int = 5
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 8.0
    honour_hint: bool = False

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"Invalid attempts {self.attempts}: expected at least 1")
        if self.initial_s < 0 or self.max_s < 0 or self.factor < 1:
            raise UsageError("Invalid backoff: waits must be >= 0 and factor >= 1")

    def wait_s(self, attempt: int, error: TransientError) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        wait = min(self.initial_s * self.factor ** (attempt - 1), self.max_s)
        return max(wait, error.delay) if self.honour_hint else wait


def retry(
    call: Callable[[], T],
    backoff: Backoff = Backoff(),  # frozen, so one shared default is safe
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, TransientError, float], None] | None = None,
) -> T:
    """Return ``call()``, retrying it after a TransientError with backoff.

    Raises the last TransientError once ``backoff.attempts`` calls failed, and any other
    error at once. ``on_retry(attempt, error, wait_s)`` is told before each wait (for logs).
    """
    attempt = 1
    while True:
        try:
            return call()
        except TransientError as e:
            if attempt >= backoff.attempts:
                raise
            wait = backoff.wait_s(attempt, e)
            if on_retry is not None:
                on_retry(attempt, e, wait)
            sleep(wait)
            attempt += 1
