"""Asynchronous saves: the training loop waits only for the host copy, never for the disk."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import numpy as np

from recovery.checkpoint.store import CheckpointStore, Peers, SaveResult
from recovery.errors import BackgroundSaveError


class AsyncCheckpointer:
    """Runs :meth:`CheckpointStore.save` on a background thread, at most one at a time.

    The caller hands over host arrays it will not modify (see
    :func:`recovery.checkpoint.tree.to_host`); the write, fsyncs, rename and retention run in
    the background. A failure is never swallowed: it is raised as
    :class:`BackgroundSaveError` from the next :meth:`save`, :meth:`wait` or :meth:`close`.
    Leaving the ``with`` block completes an in-flight save.

    Args:
        store: where checkpoints go.
        on_saved: called on the background thread after each durable save (e.g. to log).
        peers: for a job of several processes, the collectives of the checkpoint thread:
            every save is then :meth:`CheckpointStore.save_shared` (every process must save
            the same steps in the same order).
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        on_saved: Callable[[SaveResult], None] | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.store = store
        self._on_saved = on_saved
        self._peers = peers
        self._saves = 0
        self._thread: threading.Thread | None = None
        self._result: SaveResult | None = None
        self._error: BaseException | None = None
        self._pending_step: int | None = None

    @property
    def in_flight(self) -> int | None:
        """Step of the save still running, or None."""
        t = self._thread
        return self._pending_step if t is not None and t.is_alive() else None

    def save(
        self,
        step: int,
        arrays: Mapping[str, np.ndarray],
        *,
        run_config: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
        key_impls: Mapping[str, str] | None = None,
    ) -> None:
        """Start saving ``step``; first waits for (and reports) the previous save.
        ``key_impls``: as :meth:`CheckpointStore.save`."""
        self.wait()
        self._pending_step = step
        self._saves += 1
        index, peers = self._saves, self._peers

        def run() -> None:
            try:
                if peers is None:
                    result = self.store.save(
                        step, arrays, run_config=run_config, metadata=metadata,
                        key_impls=key_impls,
                    )  # fmt: skip
                else:
                    result = self.store.save_shared(
                        step, arrays, peers=peers, save_index=index,
                        run_config=run_config, metadata=metadata, key_impls=key_impls,
                    )  # fmt: skip
                self._result = result
                if self._on_saved is not None:
                    self._on_saved(result)
            except BaseException as e:  # reported to the training thread, not swallowed
                self._error = e

        self._thread = threading.Thread(target=run, name=f"checkpoint-save-{step}", daemon=False)
        self._thread.start()

    def wait(self) -> SaveResult | None:
        """Block until no save is in flight; return the last result.

        Raises:
            BackgroundSaveError: the background save failed; the cause is chained.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            step = self._pending_step
            raise BackgroundSaveError(f"background save of step {step} failed: {err}") from err
        return self._result

    def close(self) -> SaveResult | None:
        """Complete any in-flight save (same errors as :meth:`wait`)."""
        return self.wait()

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # Already failing: still finish the save so no data is lost, and keep the first
        # error as the one raised, with the save's failure attached rather than dropped.
        try:
            self.close()
        except BackgroundSaveError as save_error:
            exc.add_note(f"also: {save_error}")
