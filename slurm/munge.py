"""munged for the local cluster: its key, socket and files, reachable by user ``munge``.

munged refuses to run as root, so it runs as user ``munge``; every folder on the way to its
files must therefore be traversable by that user. When the cluster's state dir is not (pytest's
``/tmp/pytest-of-root`` is mode 0700) or its socket path would be too long for a unix socket,
munge's files go to a short private folder under the system temp dir instead.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recovery.errors import ClusterError
from recovery.proc import log_tail

MUNGE_USER = "munge"
# sun_path holds 108 bytes including the NUL; stay well below it.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class MungePaths:
    """Where munged keeps its files. ``key_dir`` is 0700 and ``socket_dir`` 0755: munged
    insists on that, and on them being separate folders."""

    home: Path

    @property
    def key_dir(self) -> Path:
        return self.home / "key"

    @property
    def key(self) -> Path:
        return self.key_dir / "munge.key"

    @property
    def socket_dir(self) -> Path:
        return self.home / "run"

    @property
    def socket(self) -> Path:
        return self.socket_dir / "munge.socket"

    @property
    def pid_file(self) -> Path:
        return self.socket_dir / "munged.pid"

    @property
    def seed(self) -> Path:
        return self.key_dir / "munged.seed"

    @property
    def log(self) -> Path:
        return self.home / "munged.log"


def traversable_by(path: Path, uid: int, gids: set[int]) -> bool:
    """True when a user (``uid`` with groups ``gids``) can reach ``path``: every existing
    folder from ``/`` down to it grants that user execute permission."""
    for d in [*reversed(path.parents), path]:
        try:
            st = d.stat()
        except FileNotFoundError:
            break  # folders we will create ourselves get mode 0755
        mode = st.st_mode
        if st.st_uid == uid:
            ok = bool(mode & stat.S_IXUSR)
        elif st.st_gid in gids:
            ok = bool(mode & stat.S_IXGRP)
        else:
            ok = bool(mode & stat.S_IXOTH)
        if not ok:
            return False
    return True


def choose_home(state_dir: Path, tmp_root: Path | None = None) -> MungePaths:
    """Pick munge's folder: ``state_dir/munge`` when user munge can reach it and the socket
    path fits, else ``<tmp>/recover-munge-<hash of state_dir>``.

    Raises ClusterError when user munge does not exist (munge not installed).
    """
    try:
        pw = pwd.getpwnam(MUNGE_USER)
    except KeyError as e:
        raise ClusterError(
            "user 'munge' does not exist: munge is not installed; "
            "install it with `apt-get install -y slurm-wlm munge` (or `./scripts/setup.sh`)"
        ) from e
    gids = {pw.pw_gid, *os.getgrouplist(MUNGE_USER, pw.pw_gid)}
    home = state_dir / "munge"
    paths = MungePaths(home)
    if traversable_by(home, pw.pw_uid, gids) and len(str(paths.socket)) <= _MAX_SOCKET_PATH:
        return paths
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    root = tmp_root or Path(tempfile.gettempdir())
    return MungePaths(root / f"recover-munge-{digest}")


def prepare(paths: MungePaths) -> None:
    """Create munge's folders with the modes munged requires and a key if there is none."""
    pw = pwd.getpwnam(MUNGE_USER)
    paths.home.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.home, 0o755)  # noqa: S103 - munged must reach its socket folder
    for d, mode in ((paths.key_dir, 0o700), (paths.socket_dir, 0o755)):
        d.mkdir(exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        os.chmod(d, mode)
    if not paths.key.exists():
        # munged wants at least 32 bytes of key; mungekey --create writes 1024 random bytes.
        fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        os.chown(paths.key, pw.pw_uid, pw.pw_gid)
    paths.log.touch()
    os.chown(paths.log, pw.pw_uid, pw.pw_gid)


def start(paths: MungePaths, env: dict[str, str], timeout_s: float = 10.0) -> int:
    """Start munged as user munge and return its pid once its socket answers.

    munged forks into the background and its parent returns only when the daemon is ready,
    so the pid comes from its pid file. Raises ClusterError with the log's tail on failure.
    """
    if shutil.which("munged") is None or shutil.which("runuser") is None:
        raise ClusterError(
            "munged not found; install it with `apt-get install -y slurm-wlm munge` "
            "(or `./scripts/setup.sh`)"
        )
    argv = [
        "runuser", "-u", MUNGE_USER, "--",
        "munged",
        f"--socket={paths.socket}",
        f"--key-file={paths.key}",
        f"--pid-file={paths.pid_file}",
        f"--log-file={paths.log}",
        f"--seed-file={paths.seed}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"munged did not start within {timeout_s:g} s") from e
    if proc.returncode != 0:
        raise ClusterError(
            f"munged failed to start (exit {proc.returncode}): {proc.stderr.strip()}\n"
            f"log {paths.log}:\n{log_tail(paths.log)}"
        )
    try:
        return int(paths.pid_file.read_text().strip())
    except (OSError, ValueError) as e:
        raise ClusterError(f"munged started but wrote no pid to {paths.pid_file}") from e


def remove(paths: MungePaths, state_dir: Path) -> None:
    """Remove munge's folder if it lives outside ``state_dir`` (the fallback in temp)."""
    if state_dir not in paths.home.parents:
        shutil.rmtree(paths.home, ignore_errors=True)
