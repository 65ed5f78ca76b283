"""Processes by pid: start one detached with its output in a log, tell whether one still runs;
and free loopback ports for the daemons they run.

Shared by the local Slurm cluster's daemons, the local API server (etcd, kube-apiserver), the
coordinator started in the background, and the local node agents.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

_PROC = Path("/proc")


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path) -> int:
    """Start ``argv`` in a new session with stdout/stderr appended to ``log``; return its pid.

    Raises OSError when the program cannot be executed.
    """
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return os.posix_spawnp(
            argv[0],
            list(argv),
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)


def stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of ``pid``, or None when it no longer exists."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may itself contain spaces or ')'.
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[1])


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (a zombie of ours is reaped on the way)."""
    st = stat(pid)
    if st is None:
        return False
    if st[0] in ("Z", "X"):
        reap(pid)
        return False
    return True


def parent_of(pid: int) -> int | None:
    """Parent pid of ``pid``, or None when it no longer exists."""
    st = stat(pid)
    return None if st is None else st[1]


def reap(pid: int) -> None:
    # Daemons started by this very process (a pytest session) become our zombies when they
    # exit; daemons started by an earlier `recover cluster up` belong to init, which reaps them.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago.

    All sockets stay open until every port is chosen, so none is handed out twice; another
    program may still take one before the daemon binds it (callers that start daemons on them
    retry, or fail naming the port).
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the log at ``path`` (for error messages); ``(no log)``
    when it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
