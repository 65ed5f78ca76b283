"""Fold repeats of one fault into one event with a count.

A fault is keyed by (node, fault, GPU, driver action): the GPU is the accelerator index, or the
bus id where the index is not known (two GPUs are never folded together), and an XID 154 that
asks for another action, or an SXid the driver called fatal after non-fatal ones, is news.
A fall-off-the-bus line and an XID 79 for the same GPU share a key (both are ``xid79``): the
burst is one fault. Its first occurrence passes at once (detection
latency is what matters); repeats within ``window_s`` after it are counted, and when the
window ends one summary event carries that count. A flood of 10,000 identical XID 95 lines
over a minute with a 30 s window becomes about four events, not 10,000.

Ids are deterministic: the summary of a window is ``<first id>.r`` (the first event's id is
itself stable), so a resend or an agent that replays the same lines produces the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.ids import derived_id
from recovery.model import HealthEvent
from recovery.ports.clock import Clock

Key = tuple[str, str, int | str | None, str | None]
#: Default folding window, in seconds.
DEFAULT_WINDOW_S = 30.0


@dataclass
class _Window:
    first: HealthEvent
    opened_at: float  # monotonic seconds
    repeats: int = 0
    last: HealthEvent | None = None


class Deduplicator:
    """Passes first occurrences, folds repeats, emits one summary per window.

    ``clock`` supplies monotonic time (``clock.now().mono``); call :meth:`flush` periodically
    (at least every few seconds) so summaries leave on time even when no new event arrives.
    Not thread-safe: the agent's single delivery thread owns it.
    """

    def __init__(self, clock: Clock, window_s: float = DEFAULT_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0 seconds, got {window_s}")
        self._clock = clock
        self._window_s = window_s
        self._open: dict[Key, _Window] = {}

    @property
    def window_s(self) -> float:
        """The folding window, in seconds."""
        return self._window_s

    def offer(self, event: HealthEvent) -> list[HealthEvent]:
        """What to deliver now for ``event``: ``[event]`` when it opens a window, ``[]`` when
        it is folded into an open one; summaries of windows that have ended come first."""
        out = self.flush()
        gpu = event.accelerator if event.accelerator is not None else event.bus_id
        key: Key = (event.node, event.fault, gpu, event.driver_action)
        window = self._open.get(key)
        if window is None:
            self._open[key] = _Window(event, self._clock.now().mono)
            return [*out, event]
        window.repeats += event.count
        window.last = event
        return out

    def flush(self) -> list[HealthEvent]:
        """Summaries of every window that has ended, oldest first; windows without repeats
        close silently."""
        now = self._clock.now().mono
        ended = [k for k, w in self._open.items() if now - w.opened_at >= self._window_s]
        ended.sort(key=lambda k: self._open[k].opened_at)
        return [s for s in (self._summary(self._open.pop(k)) for k in ended) if s is not None]

    def drain(self) -> list[HealthEvent]:
        """Summaries of every open window now, ended or not (agent shutdown)."""
        windows = sorted(self._open.values(), key=lambda w: w.opened_at)
        self._open.clear()
        return [s for s in (self._summary(w) for w in windows) if s is not None]

    def pending(self) -> int:
        """How many windows are open."""
        return len(self._open)

    def _summary(self, window: _Window) -> HealthEvent | None:
        if window.repeats == 0 or window.last is None:
            return None
        first, last = window.first, window.last
        note = f"{window.repeats} repeats within {self._window_s:g} s of the first ({first.id})"
        return last.model_copy(
            update={
                "id": derived_id(first.id, "r"),
                "count": min(window.repeats, 10**9),
                "message": f"{last.message} [{note}]"[:2048],
            }
        )
