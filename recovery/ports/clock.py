"""Time as a port: the coordinator reads both clocks through it, so tests drive time."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, order=True)
class Stamp:
    """One instant on both clocks: ``wall`` (Unix seconds, for people and for joining with
    other logs) and ``mono`` (CLOCK_MONOTONIC seconds, for durations; comparable between
    processes of the same boot)."""

    wall: float
    mono: float


class Clock(Protocol):
    """Where the coordinator gets the time."""

    def now(self) -> Stamp:
        """The current instant."""
        ...


class SystemClock:
    """The real clocks."""

    def now(self) -> Stamp:
        return Stamp(time.time(), time.monotonic())


class FakeClock:
    """A clock tests move by hand; starts at ``wall``/``mono`` and only moves on
    :meth:`advance`."""

    def __init__(self, wall: float = 1_800_000_000.0, mono: float = 1000.0) -> None:
        self._wall = wall
        self._mono = mono

    def now(self) -> Stamp:
        return Stamp(self._wall, self._mono)

    def advance(self, seconds: float) -> Stamp:
        """Move both clocks forward by ``seconds``; returns the new instant."""
        self._wall += seconds
        self._mono += seconds
        return self.now()
