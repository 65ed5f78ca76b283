"""Helpers for training tests: run ``recover train`` in-process or as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from recovery.events import read_events
from tests.helpers import RECOVER


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return list(read_events(path)) if path.exists() else []


def train_cmd(run_dir: Path, steps: int, save_every: int, *extra: str) -> list[str]:
    return [
        *RECOVER,
        "train",
        "--run-dir",
        str(run_dir),
        "--steps",
        str(steps),
        "--save-every",
        str(save_every),
        *extra,
    ]


def run_cli(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout)


def wait_for(predicate: Callable[[], bool], *, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def completed_digest(run_dir: Path) -> str:
    done = [e for e in events(run_dir) if e["event"] == "completed"]
    assert done, f"no completed event in {run_dir}"
    return str(done[-1]["state_digest"])


#: Steps of the shared 2-process control run.
K2_STEPS = 12


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compilation cache: restarts skip compiling, as in production."""
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture(scope="session")
def k2_control(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> tuple[int, str]:
    """``(steps, final digest)`` of an uninterrupted 2-process run of mlp-tiny."""
    from tests.train.multi import final_digest, run

    run_dir = tmp_path_factory.mktemp("k2-control") / "run"
    run(run_dir, 2, K2_STEPS, 4, "--compile-cache", str(cache))
    return K2_STEPS, final_digest(run_dir, 2)
