"""Shared fixtures and helpers for the checkpoint tests: a store on a real temporary directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery import fsutil
from recovery.checkpoint import CheckpointStore
from recovery.checkpoint import commit as commit_mod
from recovery.checkpoint import files as files_mod

RUN_CONFIG: dict[str, Any] = {"model": "tiny", "lr": 3e-4, "batch": 32, "seed": 0}


class FakeClock:
    """Wall clock the tests move by hand (seconds since the epoch)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _arrays_for(step: int) -> dict[str, np.ndarray]:
    """Small state whose every byte depends on ``step``, so a mix-up of steps is visible."""
    rng = np.random.default_rng(step)
    return {
        "params/w": rng.standard_normal((16, 8)).astype(np.float32),
        "params/b": np.arange(8, dtype=np.int64) + step,
        "opt/count": np.array(step, dtype=np.int32),
    }


def _assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Equal names, dtypes, shapes and bytes (bit-exact, so NaN and -0.0 count too)."""
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        w_native = w.astype(w.dtype.newbyteorder("="))
        assert g.dtype == w_native.dtype, name
        assert g.shape == w_native.shape, name
        assert g.tobytes() == w_native.tobytes(), name


#: The modules whose ``os`` a save's system calls go through: data files (``files``), the
#: manifest and directory fsyncs (``fsutil``), the renames (``commit``).
PROTOCOL_MODULES = (files_mod, fsutil, commit_mod)


def patch_os(mp: pytest.MonkeyPatch, fake: Any) -> None:
    """Put ``fake`` in place of ``os`` in every module of the save protocol, so one stand-in
    sees (and counts) every system call of a save in the order they happen."""
    for module in PROTOCOL_MODULES:
        mp.setattr(module, "os", fake)


ArraysFor = Callable[[int], dict[str, np.ndarray]]
AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]


@pytest.fixture
def arrays_for() -> ArraysFor:
    """``step -> arrays``: deterministic content for a step."""
    return _arrays_for


@pytest.fixture
def assert_same() -> AssertSame:
    """Bit-exact comparison of two ``name -> array`` mappings."""
    return _assert_same_arrays


@pytest.fixture
def run_config() -> dict[str, Any]:
    return dict(RUN_CONFIG)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"


@pytest.fixture
def store(root: Path, clock: FakeClock) -> CheckpointStore:
    return CheckpointStore(root, clock=clock)


@pytest.fixture
def commit(store: CheckpointStore, run_config: dict[str, Any]) -> Callable[[int], Path]:
    """Save ``arrays_for(step)`` as ``step`` and return its directory."""

    def _commit(step: int) -> Path:
        return store.save(step, _arrays_for(step), run_config=run_config).path

    return _commit


SplitInto = Callable[[int], None]


@pytest.fixture
def split_into(monkeypatch: pytest.MonkeyPatch) -> SplitInto:
    """``split_into(n)``: saves spread even a tiny state over up to ``n`` data files.

    The real rule starts a second file only past ``FILE_TARGET`` (32 MiB); the store looks
    ``plan_files`` up on the module, so a smaller target reaches every save. The store still
    writes with ``min(workers, files)`` threads, so ``workers=1`` stays sequential.
    """
    real = files_mod.plan_files

    def apply(n: int) -> None:
        def plan(
            sizes: Any, *, max_files: int, target: int = files_mod.FILE_TARGET, min_files: int = 1
        ) -> Any:
            return real(sizes, max_files=max(n, min_files), target=1, min_files=min_files)

        monkeypatch.setattr(files_mod, "plan_files", plan)

    return apply
