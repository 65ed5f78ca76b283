"""Processes by pid: start one detached with its output in a log, tell whether one still runs;
and free loopback ports for the daemons they run.

Shared by the local Slurm cluster's daemons, the local API server (etcd, kube-apiserver), the
coordinator started in the background, and the local node agents.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import time
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


#: Where every process of this toolkit on the machine records the ports it handed out (see
#: :func:`free_ports`); a JSON object port -> unix time, guarded by an flock on the file. Not
#: under /tmp, where another user could plant it; a user other than root keeps their own.
PORT_CLAIMS = Path(
    os.environ.get("RECOVER_PORT_CLAIMS")
    or (
        "/run/slurm-k8s-recover-ports.json"
        if os.geteuid() == 0
        else str(Path.home() / ".cache" / "slurm-k8s-recover-ports.json")
    )
)
#: How long a handed-out port stays reserved for the daemon it was chosen for, in seconds:
#: far longer than a daemon takes to bind it; once bound, the bind test keeps it off limits.
CLAIM_TTL_S = 300.0
#: Ports below the kernel's ephemeral range, so no connect() or bind(0) anywhere on the
#: machine is handed one of ours between our choice and the daemon's bind.
_LOW, _HIGH = 20000, 32000


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host``, free now and reserved for a few minutes.

    Two test workers starting clusters at once used to be handed the same port by the
    kernel (each bound port 0, closed it, and started a daemon on it later): one cluster's
    clients then talked to the other's slurmctld. Ports now come from below the ephemeral
    range (20000-31999), each free when tested and recorded in :data:`PORT_CLAIMS` under an
    exclusive lock, so no other caller of this function gets it for :data:`CLAIM_TTL_S` s.
    Raises OSError when ``count`` free ports cannot be found.
    """
    PORT_CLAIMS.parent.mkdir(parents=True, exist_ok=True)
    PORT_CLAIMS.touch(exist_ok=True)
    with PORT_CLAIMS.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        now = time.time()
        try:
            raw = json.loads(f.read() or "{}")
            claims = {int(k): float(v) for k, v in raw.items() if now - float(v) < CLAIM_TTL_S}
        except (ValueError, TypeError, AttributeError):
            claims = {}  # a torn or foreign file: start over, the bind test still guards
        chosen: list[int] = []
        candidates = list(range(_LOW, _HIGH))
        random.shuffle(candidates)
        for port in candidates:
            if len(chosen) == count:
                break
            if port not in claims and _bindable(host, port):
                chosen.append(port)
                claims[port] = now
        if len(chosen) < count:
            raise OSError(f"found only {len(chosen)} of {count} free ports in {_LOW}-{_HIGH}")
        f.seek(0)
        f.truncate()
        f.write(json.dumps({str(k): v for k, v in claims.items()}))
        return chosen


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the log at ``path`` (for error messages); ``(no log)``
    when it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
