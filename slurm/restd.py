"""slurmrestd for the local cluster: Slurm's REST daemon, started by pid, stopped with the cluster.

slurmrestd refuses to run as root or as SlurmUser (root here), so it runs as user ``nobody``
(``setpriv`` drops to it and then execs, so the pid we record is the daemon itself). Two
daemons run, one per REST authentication plugin of Debian's 22.05 (one daemon cannot serve
both, see :func:`start`):

* ``slurmrestd`` on ``127.0.0.1:PORT`` with ``rest_auth/jwt``: a request carrying
  ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` acts as that user, which slurmctld checks
  against the token (made by ``scontrol token``, signed with the cluster's ``jwt_key``; see
  ``AuthAltTypes=auth/jwt`` in ``slurm.conf``). This is how a coordinator in Kubernetes reaches
  Slurm, and the mode the contract tests use (as root, like the CLI backend).
* ``slurmrestd-local`` on a unix socket with ``rest_auth/local``: every request acts as the
  user slurmrestd runs as (``nobody``: it may read everything and submit jobs as nobody, but
  not update nodes or touch root's jobs), whoever connected.

Everything user nobody must reach (its copy of slurm.conf, the socket's folder) sits in one
folder it can traverse: ``STATE_DIR/rest`` when every folder above is traversable by others,
else a short private folder under the system temp dir (pytest's ``/tmp/pytest-of-root`` is
0700), as for munge.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from recovery import fsutil, proc
from recovery.errors import ClusterError, SlurmNotInstalledError
from slurm import install, procs
from slurm.cli_slurm import INSTALL_HINT
from slurm.install import SlurmInstall
from slurm.munge import traversable_by

REST_USER = "nobody"
#: Where :func:`save_endpoint` records, in the cluster's state dir, how to reach slurmrestd.
REST_FILE = "rest.json"
#: The OpenAPI plugins we load: Debian 22.05 also ships the slurmdbd ones (dbv0.0.3x), which
#: make slurmrestd exit at start without slurmdbd ("slurm not configured with slurmdbd").
PLUGINS = "openapi/v0.0.38"
#: Slurm 25.11 serves one OpenAPI plugin for slurmctld and picks the API version per request
#: through its data parsers (v0.0.41-v0.0.44, each path prefixed with its version).
PLUGINS_2511 = "openapi/slurmctld"


def plugins_for(inst: SlurmInstall) -> str:
    """The ``-s`` argument for ``inst``'s slurmrestd (never the slurmdbd plugins: without
    slurmdbd they make it exit at start)."""
    return PLUGINS if inst.series < (23, 2) else PLUGINS_2511


_MAX_SOCKET_PATH = 100
REST_INSTALL_HINT = "install it with `apt-get install -y slurmrestd` (or `./scripts/setup.sh`)"


@dataclass(frozen=True)
class RestPaths:
    """Where slurmrestd's files live; ``home`` is traversable by :data:`REST_USER`."""

    home: Path

    @property
    def conf(self) -> Path:
        """slurmrestd's own copy of slurm.conf (``-f``), readable by nobody."""
        return self.home / "slurm.conf"

    @property
    def socket_dir(self) -> Path:
        return self.home / "run"

    @property
    def socket(self) -> Path:
        return self.socket_dir / "slurmrestd.socket"


@dataclass(frozen=True)
class RestEndpoint:
    """How to reach a running slurmrestd: ``socket`` (rest_auth/local) and ``url``
    (rest_auth/jwt) with the token in ``token_file`` for ``user``."""

    socket: Path
    url: str
    token_file: Path
    user: str = "root"

    def to_json(self) -> dict[str, str]:
        """JSON-ready form (what ``rest.json`` and ``recover cluster up --json`` hold)."""
        return {
            "socket": str(self.socket),
            "url": self.url,
            "token_file": str(self.token_file),
            "user": self.user,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, str]) -> RestEndpoint:
        """The inverse of :meth:`to_json`."""
        return cls(Path(raw["socket"]), raw["url"], Path(raw["token_file"]), raw["user"])


def choose_home(state_dir: Path, tmp_root: Path | None = None) -> RestPaths:
    """``state_dir/rest`` when user nobody can reach it and the socket path fits, else
    ``<tmp>/recover-rest-<hash of state_dir>``."""
    pw = pwd.getpwnam(REST_USER)
    gids = {pw.pw_gid, *os.getgrouplist(REST_USER, pw.pw_gid)}
    paths = RestPaths(state_dir / "rest")
    if traversable_by(paths.home, pw.pw_uid, gids) and len(str(paths.socket)) <= _MAX_SOCKET_PATH:
        return paths
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    return RestPaths((tmp_root or Path(tempfile.gettempdir())) / f"recover-rest-{digest}")


#: Where Debian (and a default build) put Slurm's auth/jwt plugin.
_JWT_PLUGIN_GLOBS = ("/usr/lib/*/slurm-wlm/auth_jwt.so", "/usr/lib*/slurm/auth_jwt.so")
JWT_INSTALL_HINT = (
    "install it with `apt-get install -y slurm-wlm-jwt-plugin` (or ./scripts/setup.sh)"
)


def jwt_plugin_installed(inst: SlurmInstall | None = None) -> bool:
    """Whether ``inst``'s slurmctld (default: Debian's) can load ``auth/jwt`` (without it, a
    conf naming it stops slurmctld)."""
    if inst is not None and inst.plugin_dir is not None:
        return (inst.plugin_dir / "auth_jwt.so").is_file()
    return any(glob.glob(g) for g in _JWT_PLUGIN_GLOBS)


def jwt_key_path(state_dir: Path) -> Path:
    """The cluster's HS256 key for auth/jwt (read by slurmctld, running as root)."""
    return state_dir / "jwt" / "jwt_hs256.key"


def make_jwt_key(state_dir: Path) -> Path:
    """Create the cluster's JWT key (32 random bytes, mode 0600 in a 0700 folder) unless it
    exists; return its path. slurmctld refuses a key that others may read."""
    key = jwt_key_path(state_dir)
    key.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(key.parent, 0o700)
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
    return key


def make_token(
    conf: Path,
    token_file: Path,
    *,
    user: str = "root",
    lifespan_s: int = 86400,
    env: Mapping[str, str] | None = None,
) -> str:
    """Ask slurmctld for a JWT for ``user`` valid ``lifespan_s`` seconds (``scontrol token``,
    run with ``env``; None: this process's); write it to ``token_file`` (mode 0600) and return
    it. Raises ClusterError when refused (e.g. the cluster was started without JWT)."""
    inst = install.of_conf(conf)
    scontrol = inst.program("scontrol") if inst is not None else "scontrol"
    argv = [scontrol, "token", f"username={user}", f"lifespan={lifespan_s}"]
    proc = subprocess.run(
        argv,
        env=install.command_env(
            inst, {**(os.environ if env is None else env), "SLURM_CONF": str(conf)}
        ),
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    out = proc.stdout.strip()
    if proc.returncode != 0 or not out.startswith("SLURM_JWT="):
        raise ClusterError(f"scontrol token failed: {proc.stderr.strip() or out}")
    token = out.removeprefix("SLURM_JWT=")
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def prepare(paths: RestPaths, conf: Path, inst: SlurmInstall = install.SYSTEM) -> None:
    """Create slurmrestd's folders (the socket's owned by nobody) and copy slurm.conf in.

    Raises SlurmNotInstalledError when ``inst``'s slurmrestd or setpriv is missing.
    """
    if shutil.which("setpriv") is None:
        raise SlurmNotInstalledError(f"setpriv not found; {INSTALL_HINT}")
    try:
        inst.program("slurmrestd")
    except SlurmNotInstalledError as e:
        if inst.prefix is not None:
            raise
        raise SlurmNotInstalledError(f"slurmrestd not found; {REST_INSTALL_HINT}") from e
    pw = pwd.getpwnam(REST_USER)
    paths.home.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.home, 0o755)  # noqa: S103 - nobody must reach its conf and socket
    paths.socket_dir.mkdir(exist_ok=True)
    os.chown(paths.socket_dir, pw.pw_uid, pw.pw_gid)
    os.chmod(paths.socket_dir, 0o755)  # noqa: S103
    paths.socket.unlink(missing_ok=True)  # left by a killed daemon: bind would fail
    shutil.copyfile(conf, paths.conf)
    os.chmod(paths.conf, 0o644)


def start(
    paths: RestPaths,
    listen: str,
    env: Mapping[str, str],
    log: Path,
    *,
    jwt: bool,
    inst: SlurmInstall = install.SYSTEM,
    timeout_s: float = 15.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Start slurmrestd as nobody listening on ``listen`` (``unix:/path`` or ``HOST:PORT``)
    with ``rest_auth/jwt`` when ``jwt``, else ``rest_auth/local``; return its pid once it
    accepts connections there.

    One daemon cannot do both: ``SLURM_JWT=daemon``, which makes slurmrestd pass each
    request's token on to slurmctld, also makes it use auth/jwt for local requests, which
    carry no token (slurmrestd then answers 500). Raises ClusterError with the log's tail when
    it exits or does not answer within ``timeout_s`` seconds.
    """
    argv = [
        "setpriv", f"--reuid={REST_USER}", f"--regid={pwd.getpwnam(REST_USER).pw_gid}",
        "--clear-groups", "--",
        inst.program("slurmrestd"), "-f", str(paths.conf), "-s", plugins_for(inst),
        "-a", "rest_auth/jwt" if jwt else "rest_auth/local", listen,
    ]  # fmt: skip
    daemon_env = install.command_env(inst, {**env, "SLURM_CONF": str(paths.conf)})
    if jwt:
        daemon_env["SLURM_JWT"] = "daemon"
    else:
        daemon_env.pop("SLURM_JWT", None)
    pid = procs.spawn(argv, daemon_env, log)
    deadline = clock() + timeout_s
    while True:
        if not procs.alive(pid):
            raise ClusterError(f"slurmrestd exited during start;\n{proc.log_tail(log)}")
        last = _listens(listen)
        if last is None:
            return pid
        if clock() > deadline:
            procs.stop([pid], sleep=sleep, clock=clock)
            raise ClusterError(
                f"slurmrestd not ready within {timeout_s:g} s ({last});\n{proc.log_tail(log)}"
            )
        sleep(0.1)


def _listens(listen: str) -> str | None:
    """None when something accepts connections on ``listen``, else why not. slurmrestd
    opens its sockets only once it is ready to serve."""
    try:
        if listen.startswith("unix:"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(listen.removeprefix("unix:"))
        else:
            host, _, port = listen.rpartition(":")
            socket.create_connection((host, int(port)), timeout=2).close()
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


#: The two daemons :func:`launch` starts, as recorded among the cluster's pids.
DAEMONS = ("slurmrestd", "slurmrestd-local")


def launch(
    state_dir: Path,
    conf: Path,
    port: int,
    record: Callable[[str, int], None],
    inst: SlurmInstall = install.SYSTEM,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 15.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RestEndpoint:
    """Start both :data:`DAEMONS` for the cluster in ``state_dir`` (JWT on
    ``127.0.0.1:port``, local auth on a unix socket) and a JWT for root; ``record(name, pid)``
    is called as each starts. ``env``: the cluster's environment (None: this process's).
    Raises as :func:`prepare`, :func:`start` and :func:`make_token`.
    """
    paths = choose_home(state_dir)
    prepare(paths, conf, inst)
    base = os.environ if env is None else env
    marked = {**base, procs.MARKER_ENV: str(state_dir)}
    listen = f"127.0.0.1:{port}"
    for name, where, jwt in (
        (DAEMONS[0], listen, True),
        (DAEMONS[1], f"unix:{paths.socket}", False),
    ):
        log = state_dir / "log" / f"{name}.out"
        pid = start(
            paths, where, marked, log, jwt=jwt, inst=inst, timeout_s=timeout_s, clock=clock,
            sleep=sleep,
        )  # fmt: skip
        record(name, pid)
    token_file = jwt_key_path(state_dir).parent / "token"
    make_token(conf, token_file, env=base)
    return RestEndpoint(paths.socket, f"http://{listen}", token_file)


def save_endpoint(state_dir: Path, endpoint: RestEndpoint) -> None:
    """Record ``endpoint`` in ``state_dir/rest.json`` (atomically)."""
    data = (json.dumps(endpoint.to_json(), indent=2) + "\n").encode()
    fsutil.atomic_write(state_dir / REST_FILE, data)


def load_endpoint(state_dir: Path) -> RestEndpoint | None:
    """The endpoint recorded in ``state_dir``, or None; ClusterError when unreadable."""
    return fsutil.read_json(state_dir / REST_FILE, RestEndpoint.from_json, error=ClusterError)


def remove(paths: RestPaths, state_dir: Path) -> None:
    """Remove slurmrestd's folder if it lives outside ``state_dir`` (the fallback in temp)."""
    if state_dir not in paths.home.parents:
        shutil.rmtree(paths.home, ignore_errors=True)
