"""The coordinator as a background process: start it, find it, stop it, by pid.

The local bring-up (:mod:`service.bringup`: ``recover cluster up --coordinator``, the scenario
runner) and the test fixtures all start it the same way: ``python -m recover coordinator
serve --state-dir DIR ...`` in its own session, its output in ``DIR/coordinator.log``. The
serving process writes ``DIR/coordinator.json`` (url, pid) once it listens; :func:`start`
waits for ``/healthz`` to answer before it returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from recovery.errors import CoordinatorUnavailableError
from recovery.proc import alive, spawn
from recovery.proc import log_tail as _log_tail
from recovery.statedir import ENDPOINT_FILE, LOG_FILE, Endpoint, read_endpoint


def healthy(url: str, timeout_s: float = 1.0) -> bool:
    """True when ``GET url/healthz`` answers 200."""
    try:
        return httpx.get(f"{url}/healthz", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def start(
    state_dir: Path,
    *,
    slurm_conf: Path,
    listen: str = "127.0.0.1:0",
    config: Path | None = None,
    dry_run: bool = False,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Endpoint:
    """Start ``recover coordinator serve`` in the background and return once it is healthy.

    A no-op returning the running one when a healthy coordinator is recorded in ``state_dir``.
    Raises CoordinatorUnavailableError with the log's tail when it exits or does not answer
    within ``timeout_s`` seconds.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    current = read_endpoint(state_dir)
    if current is not None and alive(current.pid) and healthy(current.url):
        return current
    (state_dir / ENDPOINT_FILE).unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "recover", "coordinator", "serve",
        "--state-dir", str(state_dir), "--listen", listen, "--slurm-conf", str(slurm_conf),
    ]  # fmt: skip
    if config is not None:
        argv += ["--config", str(config)]
    if dry_run:
        argv.append("--dry-run")
    argv += list(extra_args)
    pid = spawn(argv, os.environ if env is None else env, state_dir / LOG_FILE)
    deadline = clock() + timeout_s
    while clock() < deadline:
        if not alive(pid):
            raise CoordinatorUnavailableError(
                f"the coordinator exited at start;\n{log_tail(state_dir)}"
            )
        ep = read_endpoint(state_dir)
        if ep is not None and ep.pid == pid and healthy(ep.url):
            return ep
        sleep(0.1)
    stop(state_dir)
    raise CoordinatorUnavailableError(
        f"the coordinator did not answer within {timeout_s:g} s;\n{log_tail(state_dir)}"
    )


def stop(
    state_dir: Path,
    *,
    grace_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """SIGTERM the coordinator recorded in ``state_dir`` (SIGKILL after ``grace_s`` seconds).
    Returns False when none was running."""
    ep = read_endpoint(state_dir)
    if ep is None or not alive(ep.pid):
        (state_dir / ENDPOINT_FILE).unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(ep.pid, signal.SIGTERM)
    deadline = clock() + grace_s
    while clock() < deadline and alive(ep.pid):
        sleep(0.05)
    if alive(ep.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(ep.pid, signal.SIGKILL)
        while alive(ep.pid):
            sleep(0.05)
    (state_dir / ENDPOINT_FILE).unlink(missing_ok=True)
    return True


def log_tail(state_dir: Path, lines: int = 15) -> str:
    """The last lines of the coordinator's log (for error messages)."""
    return _log_tail(state_dir / LOG_FILE, lines)
