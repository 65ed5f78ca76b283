"""Running the examples (``examples/flax_lm``, ``examples/nnx_regression``) as users do: a
real process, real signals."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.api import read_events

ROOT = Path(__file__).resolve().parents[2]
FLAX_LM = ROOT / "examples" / "flax_lm" / "train.py"
#: Steps of every run of the example in these tests, and its checkpoint period.
STEPS, SAVE_EVERY = 40, 10


@pytest.fixture(scope="session")
def example_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment the example runs in: CPU, and one JAX compilation cache for the
    session, so that only the first run of a program pays for compiling it."""
    cache = tmp_path_factory.mktemp("jax-cache")
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(FLAX_LM), "--run-dir", str(run_dir),
        "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), *extra,
    ]  # fmt: skip


def run(run_dir: Path, env: dict[str, str], *extra: str) -> str:
    """Run the example to the end; its final state digest (fails unless it exits 0)."""
    done = subprocess.run(
        command(run_dir, *extra), env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m = re.search(rf"completed step {STEPS} state_digest (\w+)", done.stdout)
    assert m is not None, done.stdout
    return m.group(1)


@pytest.fixture(scope="session")
def control_digest(tmp_path_factory: pytest.TempPathFactory, example_env: dict[str, str]) -> str:
    """The final digest of an uninterrupted run."""
    return run(tmp_path_factory.mktemp("control") / "run", example_env)


def events(run_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    logged = list(read_events(path)) if path.exists() else []
    return [e for e in logged if name is None or e["event"] == name]


def wait_for_event(run_dir: Path, name: str, min_step: int, proc: Any = None) -> None:
    """Until ``run_dir``'s log has event ``name`` at ``min_step`` or later (a real condition,
    polled); fails if ``proc`` ended first or after 600 s (generous: a loaded machine)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if any(e["step"] >= min_step for e in events(run_dir, name)):
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended ({proc.returncode}) before {name} {min_step}")
        time.sleep(0.05)
    pytest.fail(f"no {name} event at step >= {min_step} in {run_dir} within 600 s")
