"""Retention: the pure rule, and what survives saves that fail part way."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery import fsutil
from recovery.checkpoint import CheckpointStore, RetentionPolicy, steps_to_delete
from recovery.checkpoint import files as files_mod
from recovery.checkpoint import format as fmt
from recovery.errors import UsageError
from tests.unit.checkpoint.conftest import patch_os

ArraysFor = Callable[[int], dict[str, np.ndarray]]
AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]

# --- the pure rule ---------------------------------------------------------------------------

policies = st.builds(
    RetentionPolicy,
    keep_last=st.integers(1, 6),
    keep_every=st.none() | st.integers(1, 40),
)
step_sets = st.sets(st.integers(0, 120), max_size=25)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[int], RetentionPolicy, int]:
    steps = sorted(draw(step_sets))
    policy = draw(policies)
    # Usually one of the steps (the save that just finished); sometimes any number.
    anywhere = st.integers(0, 130)
    newest = draw(st.sampled_from(steps) | anywhere if steps else anywhere)
    return steps, policy, newest


@settings(deadline=None, max_examples=300)
@given(cases())
def test_steps_to_delete_properties(case: tuple[list[int], RetentionPolicy, int]) -> None:
    steps, policy, newest = case
    doomed = steps_to_delete(steps, policy, newest_durable=newest)

    assert doomed == sorted(set(doomed)), "ascending, no repeats"
    assert set(doomed) <= set(steps)
    assert newest not in doomed, "the newest durable step is never deleted"
    assert all(s < newest for s in doomed), "nothing at or past newest_durable is deleted"
    candidates = [s for s in steps if s <= newest]
    assert not set(candidates[-policy.keep_last :]) & set(doomed), "the last keep_last are kept"
    if policy.keep_every:
        assert all(s % policy.keep_every for s in doomed), "milestones are kept"
    # And everything else goes: the rule is exact, not merely cautious.
    expected = [
        s
        for s in candidates[: -policy.keep_last]
        if s != newest and not (policy.keep_every and s % policy.keep_every == 0)
    ]
    assert doomed == expected


@settings(deadline=None, max_examples=100)
@given(step_sets, policies)
def test_steps_to_delete_is_idempotent(steps: set[int], policy: RetentionPolicy) -> None:
    if not steps:
        return
    newest = max(steps)
    first = steps_to_delete(sorted(steps), policy, newest_durable=newest)
    survivors = sorted(steps - set(first))
    assert steps_to_delete(survivors, policy, newest_durable=newest) == []


@pytest.mark.parametrize(
    ("policy", "newest", "expected"),
    [
        (RetentionPolicy(keep_last=3), 10, [1, 2, 3, 4, 5, 6, 7]),
        (RetentionPolicy(keep_last=3, keep_every=4), 10, [1, 2, 3, 5, 6, 7]),
        (RetentionPolicy(keep_last=1), 10, list(range(1, 10))),
        (RetentionPolicy(keep_last=2), 5, [1, 2, 3]),  # 6..10 are newer: left alone
        (RetentionPolicy(keep_last=20), 10, []),
    ],
)
def test_steps_to_delete_examples(
    policy: RetentionPolicy, newest: int, expected: list[int]
) -> None:
    assert steps_to_delete(list(range(1, 11)), policy, newest_durable=newest) == expected


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"keep_last": 0}, "keep_last must be >= 1"), ({"keep_every": 0}, "keep_every must be >= 1")],
)
def test_invalid_policy_is_a_usage_error(kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        RetentionPolicy(**kwargs)


# --- retention in the store ------------------------------------------------------------------


@pytest.fixture
def kept(root: Path, clock: Any) -> CheckpointStore:
    return CheckpointStore(root, clock=clock, retention=RetentionPolicy(keep_last=2))


def _save(store: CheckpointStore, step: int, arrays_for: ArraysFor, cfg: dict[str, Any]) -> Any:
    return store.save(step, arrays_for(step), run_config=cfg)


def test_retention_after_each_save(
    kept: CheckpointStore, arrays_for: ArraysFor, run_config: dict[str, Any]
) -> None:
    deleted = [_save(kept, s, arrays_for, run_config).deleted_steps for s in (1, 2, 3, 4)]
    assert deleted == [(), (), (1,), (2,)]
    assert kept.steps() == [3, 4]
    assert sorted(p.name for p in kept.root.iterdir()) == ["step_00000003", "step_00000004"]


def test_store_without_retention_keeps_everything(
    store: CheckpointStore, arrays_for: ArraysFor, run_config: dict[str, Any]
) -> None:
    for s in range(5):
        assert _save(store, s, arrays_for, run_config).deleted_steps == ()
    assert store.steps() == [0, 1, 2, 3, 4]
    assert store.apply_retention(newest_durable=4) == ([], [])


class _FailOnCall:
    """Wraps a function; the ``n``-th call (1-based, thread-safe count) raises OSError."""

    def __init__(self, real: Callable[..., Any], n: int) -> None:
        self.real, self.n, self.calls = real, n, 0
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls += 1
            fail = self.calls == self.n
        if fail:
            raise OSError(5, "Input/output error (injected)")
        return self.real(*args, **kwargs)


class _OsWithFailing:
    """Stands in for the ``os`` module of the save protocol; the n-th call of one function
    fails."""

    def __init__(self, name: str, n: int) -> None:
        setattr(self, name, _FailOnCall(getattr(os, name), n))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


class _Unconvertible:
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise RuntimeError("device array was deleted")


def _break(mp: pytest.MonkeyPatch, module: Any, function: str, n: int) -> None:
    """The n-th call of ``module.<function>`` (as the store looks it up) fails."""
    mp.setattr(module, function, _FailOnCall(getattr(module, function), n))


def _break_os(mp: pytest.MonkeyPatch, name: str, n: int) -> None:
    """The n-th ``os.<name>`` call of the save protocol fails."""
    patch_os(mp, _OsWithFailing(name, n))


def _split(mp: pytest.MonkeyPatch, n: int) -> None:
    real = files_mod.plan_files
    mp.setattr(files_mod, "plan_files", lambda sizes, **_: real(sizes, max_files=n, target=1))


def _third_of_three_data_files(mp: pytest.MonkeyPatch) -> None:
    _split(mp, 3)
    _break(mp, files_mod, "write_packed", 3)


FAILURES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "first-data-file-write": lambda mp: _break(mp, files_mod, "write_packed", 1),
    "third-of-3-data-files": _third_of_three_data_files,
    "torn-data-write": lambda mp: _break_os(mp, "write", 2),
    "data-fsync": lambda mp: _break_os(mp, "fsync", 1),
    "manifest-write": lambda mp: _break(mp, fsutil, "write_new", 1),
    "tmp-dir-fsync": lambda mp: _break(mp, fsutil, "fsync_dir", 1),
    "commit-rename": lambda mp: _break_os(mp, "rename", 1),
}


@pytest.mark.parametrize("failure", [*sorted(FAILURES), "unconvertible-array"])
def test_failed_save_deletes_nothing_and_a_later_save_applies_retention(
    failure: str,
    kept: CheckpointStore,
    arrays_for: ArraysFor,
    assert_same: AssertSame,
    run_config: dict[str, Any],
) -> None:
    for s in (1, 2, 3):
        _save(kept, s, arrays_for, run_config)
    assert kept.steps() == [2, 3]

    with pytest.MonkeyPatch.context() as mp:
        arrays: dict[str, Any] = dict(arrays_for(4))
        if failure == "unconvertible-array":
            arrays["opt/count"] = _Unconvertible()
            expected_error: type[BaseException] = RuntimeError
        else:
            FAILURES[failure](mp)
            expected_error = OSError
        with pytest.raises(expected_error):
            kept.save(4, arrays, run_config=run_config)

    # Nothing committed was touched; the newest intact step still restores.
    assert kept.steps() == [2, 3]
    result = kept.restore_latest(run_config=run_config)
    assert (result.loaded.step, result.fallbacks) == (3, [])
    assert_same(result.loaded.arrays, arrays_for(3))
    assert_same(kept.load(2).arrays, arrays_for(2))
    leftovers = [p.name for p in kept.root.iterdir() if p.name.startswith(fmt.TMP_PREFIX)]
    assert all(n.startswith(".tmp-step_00000004-") for n in leftovers)
    assert kept.remove_leftovers() == sorted(leftovers)

    # The next save succeeds and retention resumes from where it was.
    assert _save(kept, 4, arrays_for, run_config).deleted_steps == (2,)
    assert _save(kept, 5, arrays_for, run_config).deleted_steps == (3,)
    assert kept.steps() == [4, 5]
    assert_same(kept.restore_latest(run_config=run_config).loaded.arrays, arrays_for(5))


def test_failed_retention_delete_leaves_the_new_step_committed(
    kept: CheckpointStore,
    arrays_for: ArraysFor,
    run_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for s in (1, 2):
        _save(kept, s, arrays_for, run_config)
    # Rename 1 commits step 3; rename 2 would move step 1 to the trash.
    patch_os(monkeypatch, _OsWithFailing("rename", 2))
    result = _save(kept, 3, arrays_for, run_config)  # the save itself succeeded: no raise
    monkeypatch.undo()

    assert result.step == 3
    assert result.deleted_steps == ()
    (error,) = result.retention_errors
    assert "step 1" in error
    assert "injected" in error
    assert kept.steps() == [1, 2, 3]
    assert kept.restore_latest(run_config=run_config).loaded.step == 3
    assert not [p for p in kept.root.iterdir() if p.name.startswith(fmt.TRASH_PREFIX)]
    # Retried by the next save (or by hand).
    assert kept.apply_retention(newest_durable=3) == ([1], [])
    assert kept.steps() == [2, 3]
    later = _save(kept, 4, arrays_for, run_config)
    assert (later.deleted_steps, later.retention_errors) == ((2,), ())


def test_a_failed_deletion_does_not_stop_the_others(
    root: Path, arrays_for: ArraysFor, run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root)
    for s in (1, 2, 3):
        _save(store, s, arrays_for, run_config)
    store.retention = RetentionPolicy(keep_last=1)
    patch_os(monkeypatch, _OsWithFailing("rename", 2))  # step 1 to the trash

    result = _save(store, 4, arrays_for, run_config)

    assert result.deleted_steps == (2, 3)
    assert [e.split(":")[0] for e in result.retention_errors] == ["step 1"]
    assert store.steps() == [1, 4]


def test_successful_save_reports_no_retention_errors(
    kept: CheckpointStore, arrays_for: ArraysFor, run_config: dict[str, Any]
) -> None:
    results = [_save(kept, s, arrays_for, run_config) for s in (1, 2, 3)]
    assert [r.retention_errors for r in results] == [(), (), ()]


def test_retention_never_deletes_a_newer_step_than_the_one_saved(
    kept: CheckpointStore, arrays_for: ArraysFor, run_config: dict[str, Any]
) -> None:
    # A run resumed from step 4 after step 8 was found damaged writes step 5, 6, ...
    for s in (2, 4, 8):
        CheckpointStore(kept.root).save(s, arrays_for(s), run_config=run_config)
    (kept.step_path(8) / fmt.MANIFEST).unlink()

    assert _save(kept, 5, arrays_for, run_config).deleted_steps == (2,)
    assert kept.steps() == [4, 5, 8]
