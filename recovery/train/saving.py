"""Checkpoints from the training loop: hand a state to the background saver, at most one
in flight, and record each save in the event log once it is durable. With several processes
every save is a collective (each writes its share; see :mod:`recovery.checkpoint.shared`),
made in the same order everywhere, so every process records the same steps and digests."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recovery.checkpoint import AsyncCheckpointer, CheckpointStore, Peers, SaveResult
from recovery.events import EventLog

Log = Callable[[str], None]


def log_retention_errors(log: Log, errors: Sequence[str]) -> None:
    """One line per old checkpoint that could not be deleted (retried by the next save)."""
    for error in errors:
        log(f"recover: could not delete an old checkpoint ({error}); will retry later")


class Saver:
    """Hands states to the background checkpointer, at most one save in flight, and logs
    each save once it is durable (the ``checkpoint`` event, from the saving thread)."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        run_config: Mapping[str, Any],
        events: EventLog,
        log: Log,
        async_save: bool,
        peers: Peers | None = None,
    ) -> None:
        self._run_config = run_config
        # Several processes record their count (a single process keeps the manifests it
        # always wrote): a restore with another count says so.
        self._metadata: dict[str, Any] = {} if peers is None else {"processes": peers.size}
        self._events = events
        self._log = log
        self._async = async_save
        # step -> seconds the loop was blocked handing that save over (previous save + copy)
        self._blocked: dict[int, float] = {}
        self.checkpointer = AsyncCheckpointer(store, on_saved=self._saved, peers=peers)

    def _saved(self, result: SaveResult) -> None:
        log_retention_errors(self._log, result.retention_errors)
        self._events.emit(
            "checkpoint",
            step=result.step,
            checkpoint_step=result.step,
            state_digest=result.state_digest,
            bytes=result.total_bytes,
            save_s=round(result.seconds, 6),
            blocked_s=round(self._blocked.get(result.step, 0.0), 6),
            deleted_steps=list(result.deleted_steps),
        )

    def _hand_over(self, step: int, state: Any) -> float:
        """Start saving ``state`` as ``step``; the seconds the caller was blocked."""
        from recovery.checkpoint import tree

        t = time.perf_counter()
        self.checkpointer.wait()  # at most one save in flight; raises if the previous failed
        host = tree.to_host(state)
        blocked = self._blocked[step] = time.perf_counter() - t
        metadata = {"data_position": step, **self._metadata}
        self.checkpointer.save(step, host, run_config=self._run_config, metadata=metadata)
        return blocked

    def periodic(self, step: int, state: Any) -> None:
        """Save ``step`` in the background (or wait for it, without ``async_save``).

        Raises:
            BackgroundSaveError: the previous save failed (or this one, when waited for).
        """
        blocked = self._hand_over(step, state)
        if not self._async:
            self.checkpointer.wait()
        elif blocked > 1.0:
            self._log(f"recover: training blocked {blocked:.2f}s handing step {step} to the saver")

    def final(self, step: int, state: Any, *, restored: tuple[int, str] | None) -> str:
        """The state digest of ``state`` at ``step`` once it is durable: saved and waited for
        unless the newest save, or the ``restored`` checkpoint ``(step, state digest)``, is
        that step already.

        Raises:
            BackgroundSaveError: this save or the one before it failed.
        """
        last = self.checkpointer.wait()
        if last is not None and last.step == step:
            return last.state_digest
        if restored is not None and restored[0] == step:
            return restored[1]
        self._hand_over(step, state)
        done = self.checkpointer.wait()
        assert done is not None, "a save that raised nothing has a result"
        return done.state_digest
