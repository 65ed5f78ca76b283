"""AsyncCheckpointer: background saves that never swallow a failure and never overlap."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore, SaveResult
from recovery.checkpoint.asyncsave import AsyncCheckpointer
from recovery.errors import BackgroundSaveError, CheckpointError

ArraysFor = Callable[[int], dict[str, np.ndarray]]
AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]
GUARD_S = 30.0  # only a guard against a hung test; nothing is asserted on time


def _failing_save(step: int, *args: Any, **kwargs: Any) -> SaveResult:
    raise OSError(28, f"No space left on device (step {step})")


@pytest.mark.parametrize("reported_by", ["save", "wait", "close", "with"])
def test_background_failure_is_raised_on_the_next_call(
    store: CheckpointStore,
    arrays_for: ArraysFor,
    run_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    reported_by: str,
) -> None:
    monkeypatch.setattr(store, "save", _failing_save)
    ckpt = AsyncCheckpointer(store)

    def report() -> None:
        if reported_by == "with":
            with ckpt:
                ckpt.save(1, arrays_for(1), run_config=run_config)
            return
        ckpt.save(1, arrays_for(1), run_config=run_config)
        if reported_by == "save":
            ckpt.save(2, arrays_for(2), run_config=run_config)
        else:
            getattr(ckpt, reported_by)()

    with pytest.raises(BackgroundSaveError) as info:
        report()

    err = info.value
    assert isinstance(err, CheckpointError)
    assert "background save of step 1 failed" in str(err)
    assert "No space left on device" in str(err)
    assert isinstance(err.__cause__, OSError)
    assert err.__cause__.errno == 28
    # Reported once; the checkpointer is usable afterwards.
    assert ckpt.wait() is None
    assert ckpt.in_flight is None


def test_save_that_reports_a_failure_does_not_start_its_step(
    store: CheckpointStore,
    arrays_for: ArraysFor,
    run_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_save = store.save
    monkeypatch.setattr(store, "save", _failing_save)
    ckpt = AsyncCheckpointer(store)
    ckpt.save(1, arrays_for(1), run_config=run_config)
    monkeypatch.setattr(store, "save", real_save)

    with pytest.raises(BackgroundSaveError):
        ckpt.save(2, arrays_for(2), run_config=run_config)
    # The failed call did not start step 2; a retry does.
    assert store.steps() == []
    ckpt.save(2, arrays_for(2), run_config=run_config)
    result = ckpt.close()
    assert result is not None
    assert result.step == 2
    assert store.steps() == [2]


def test_body_error_wins_over_a_background_failure(
    store: CheckpointStore,
    arrays_for: ArraysFor,
    run_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store, "save", _failing_save)

    def train() -> None:
        with AsyncCheckpointer(store) as c:
            c.save(1, arrays_for(1), run_config=run_config)
            raise KeyError("from the training loop")

    with pytest.raises(KeyError, match="from the training loop"):
        train()


class BlockingStore:
    """Wraps a real store; each save waits for its own go-ahead and records its span."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.events: list[str] = []
        self.started = {s: threading.Event() for s in range(10)}
        self.go = {s: threading.Event() for s in range(10)}
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def save(self, step: int, arrays: Any, **kwargs: Any) -> SaveResult:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.events.append(f"start {step}")
        self.started[step].set()
        assert self.go[step].wait(GUARD_S)
        try:
            return self.store.save(step, arrays, **kwargs)
        finally:
            with self._lock:
                self.active -= 1
                self.events.append(f"end {step}")


def test_at_most_one_save_in_flight(
    store: CheckpointStore, arrays_for: ArraysFor, run_config: dict[str, Any]
) -> None:
    blocking = BlockingStore(store)
    ckpt = AsyncCheckpointer(blocking)  # type: ignore[arg-type]
    ckpt.save(1, arrays_for(1), run_config=run_config)
    assert blocking.started[1].wait(GUARD_S)
    assert ckpt.in_flight == 1

    second = threading.Thread(
        target=ckpt.save, args=(2, arrays_for(2)), kwargs={"run_config": run_config}
    )
    second.start()
    second.join(0.2)
    # Step 1 cannot finish before its go-ahead, so a correct save(2) is still waiting.
    assert second.is_alive()
    assert blocking.events == ["start 1"]

    blocking.go[1].set()
    second.join(GUARD_S)
    assert not second.is_alive()
    blocking.go[2].set()
    result = ckpt.close()

    assert blocking.events == ["start 1", "end 1", "start 2", "end 2"]
    assert blocking.max_active == 1
    assert result is not None
    assert result.step == 2
    assert store.steps() == [1, 2]


def test_leaving_the_with_block_completes_the_save_and_calls_on_saved(
    store: CheckpointStore,
    arrays_for: ArraysFor,
    assert_same: AssertSame,
    run_config: dict[str, Any],
) -> None:
    blocking = BlockingStore(store)
    seen: list[tuple[int, Path, str]] = []

    def on_saved(result: SaveResult) -> None:
        seen.append((result.step, result.path, threading.current_thread().name))

    leaving = threading.Event()

    def release_once_leaving() -> None:
        assert leaving.wait(GUARD_S)
        blocking.go[7].set()

    releaser = threading.Thread(target=release_once_leaving)
    releaser.start()
    with AsyncCheckpointer(blocking, on_saved=on_saved) as ckpt:  # type: ignore[arg-type]
        ckpt.save(7, arrays_for(7), run_config=run_config, metadata={"loss": 0.5})
        assert blocking.started[7].wait(GUARD_S)
        assert seen == []
        leaving.set()  # the save can finish only after this point
    releaser.join(GUARD_S)

    # __exit__ returned, so the save is durable and on_saved has run.
    assert ckpt.in_flight is None
    assert seen == [(7, store.step_path(7), "checkpoint-save-7")]
    loaded = store.load(7, run_config=run_config)
    assert_same(loaded.arrays, arrays_for(7))
    assert loaded.manifest.metadata == {"loss": 0.5}


def test_wait_without_any_save(store: CheckpointStore) -> None:
    ckpt = AsyncCheckpointer(store)
    assert ckpt.wait() is None
    assert ckpt.close() is None
    assert ckpt.in_flight is None
