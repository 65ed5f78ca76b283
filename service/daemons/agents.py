"""The local cluster's node agents as background processes: one ``python -m agents run`` per
node, each following its own kernel-log file (all simulated nodes share one kernel, so each
gets ``STATE_DIR/agents/NODE/kmsg``), spooling in ``STATE_DIR/agents/NODE/spool``. STATE_DIR
is the coordinator's state dir (its tokens file gives each agent its token). Started and
stopped by pid; ``STATE_DIR/agents.json`` records them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from recovery.errors import CoordinatorUnavailableError
from recovery.fsutil import atomic_write, read_json
from recovery.proc import alive, spawn
from recovery.statedir import TOKENS_FILE

AGENTS_FILE = "agents.json"


def node_dir(state_dir: Path, node: str) -> Path:
    """Where ``node``'s agent keeps its kernel-log file, spool and log."""
    return state_dir / "agents" / node


def kmsg_file(state_dir: Path, node: str) -> Path:
    """The simulated kernel log ``node``'s agent follows (``recover inject --via kmsg``
    writes there)."""
    return node_dir(state_dir, node) / "kmsg"


def running(state_dir: Path) -> dict[str, int]:
    """Node -> pid of the agents recorded in ``state_dir`` that still run. Raises
    RecoverError naming the file when it is unreadable or damaged."""
    pids = read_json(state_dir / AGENTS_FILE, lambda raw: {str(n): int(p) for n, p in raw.items()})
    return {n: p for n, p in (pids or {}).items() if alive(p)}


def start_agents(
    state_dir: Path,
    nodes: Sequence[str],
    url: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    connected: Callable[[], set[str]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, int]:
    """Start an agent for every node in ``nodes`` that has none running; returns node -> pid.

    ``connected()`` (the nodes whose agents polled the coordinator) is waited on until every
    node is there, so an injection right after this returns reaches a listening agent. Raises
    CoordinatorUnavailableError (naming the agent's log) when an agent exits or does not
    connect within ``timeout_s`` seconds.
    """
    pids = running(state_dir)
    for node in nodes:
        if node in pids:
            continue
        d = node_dir(state_dir, node)
        d.mkdir(parents=True, exist_ok=True)
        kmsg_file(state_dir, node).touch()
        argv = [
            sys.executable, "-m", "agents", "run", "--node", node, "--coordinator", url,
            "--token-file", str(state_dir / TOKENS_FILE), "--sources", "kmsg,inject,progress",
            "--spool", str(d / "spool"), "--kmsg-file", str(kmsg_file(state_dir, node)),
            "--simulated-gpus", "8", "--heartbeat", "2",
        ]  # fmt: skip
        pids[node] = spawn(argv, os.environ if env is None else env, d / "agent.log")
    atomic_write(state_dir / AGENTS_FILE, (json.dumps(pids, indent=2) + "\n").encode())
    if connected is None:
        return pids
    deadline = clock() + timeout_s
    while not set(nodes) <= connected():
        dead = [n for n, p in pids.items() if not alive(p)]
        if dead or clock() > deadline:
            why = f"exited: {', '.join(dead)}" if dead else f"not connected within {timeout_s:g} s"
            log = node_dir(state_dir, (dead or list(nodes))[0]) / "agent.log"
            raise CoordinatorUnavailableError(f"node agents {why}; see {log}")
        sleep(0.1)
    return pids


def stop_agents(state_dir: Path, *, grace_s: float = 10.0) -> list[str]:
    """SIGTERM every recorded agent (SIGKILL after ``grace_s`` s); returns the nodes stopped."""
    pids = running(state_dir)
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.05)
    for pid in pids.values():
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    while any(alive(p) for p in pids.values()):
        time.sleep(0.05)
    (state_dir / AGENTS_FILE).unlink(missing_ok=True)
    return sorted(pids)
