"""The retry helper: transient errors are retried with backoff, verdicts never."""

from __future__ import annotations

import pytest

from recovery.errors import SlurmRefusedError, SlurmUnavailableError, TransientError, UsageError
from recovery.retry import Backoff, retry


class Flaky:
    """Fails with the given errors in turn, then returns "ok"; counts calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_transient_errors_are_retried_with_growing_waits() -> None:
    waits: list[float] = []
    call = Flaky(SlurmUnavailableError("down"), SlurmUnavailableError("down"))
    assert (
        retry(call, Backoff(attempts=5, initial_s=0.5, factor=2, max_s=8), sleep=waits.append)
        == "ok"
    )
    assert call.calls == 3
    assert waits == [0.5, 1.0]


def test_waits_are_capped() -> None:
    waits: list[float] = []
    call = Flaky(*[SlurmUnavailableError("down") for _ in range(5)])
    retry(call, Backoff(attempts=6, initial_s=1, factor=3, max_s=4), sleep=waits.append)
    assert waits == [1, 3, 4, 4, 4]


def test_gives_up_after_the_last_attempt_with_the_last_error() -> None:
    waits: list[float] = []
    last = SlurmUnavailableError("still down")
    call = Flaky(SlurmUnavailableError("down"), SlurmUnavailableError("down"), last)
    with pytest.raises(SlurmUnavailableError) as info:
        retry(call, Backoff(attempts=3), sleep=waits.append)
    assert info.value is last
    assert call.calls == 3
    assert len(waits) == 2


def test_verdicts_are_never_retried() -> None:
    waits: list[float] = []
    call = Flaky(SlurmRefusedError("invalid state"))
    with pytest.raises(SlurmRefusedError):
        retry(call, sleep=waits.append)
    assert call.calls == 1
    assert waits == []


def test_the_errors_delay_hint_is_honoured_when_asked() -> None:
    waits: list[float] = []
    seen: list[tuple[int, float]] = []
    call = Flaky(TransientError("busy", delay=5.0))
    retry(
        call,
        Backoff(initial_s=0.5, honour_hint=True),
        sleep=waits.append,
        on_retry=lambda attempt, _e, wait: seen.append((attempt, wait)),
    )
    assert waits == [5.0]
    assert seen == [(1, 5.0)]


@pytest.mark.parametrize(
    "kwargs", [{"attempts": 0}, {"initial_s": -1.0}, {"factor": 0.5}, {"max_s": -2.0}]
)
def test_invalid_backoff_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError, match="Invalid"):
        Backoff(**kwargs)  # type: ignore[arg-type]
