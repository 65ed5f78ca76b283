"""A private PostgreSQL server for the session (Debian's ``postgresql-15``, which ``.ci/run``
and ``scripts/setup.sh`` install): ``initdb`` into a temporary directory, the server on a Unix
socket only (no TCP port), as the ``postgres`` user when the tests run as root (the server
refuses root). Each test that asks for ``pg_dsn`` gets a database of its own, dropped after.
The server is stopped at the end of the session, by its pid; nothing is left behind.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HINT = "apt-get install -y postgresql-15 (or ./scripts/setup.sh --no-demo)"


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


@dataclass
class PgServer:
    data: Path
    sockets: Path
    port: int
    pid: int
    runas: list[str]
    proc: subprocess.Popen[bytes]

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.sockets} port={self.port} user=postgres dbname={dbname}"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(sql)
            return "" if cur.description is None else str(cur.fetchall())

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGINT)  # "fast" shutdown
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.wait()
                return
            if self.proc.poll() is not None and self.proc.pid == self.pid:
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.wait()

    def wait(self) -> None:
        """After :meth:`stop`: reap what was started (runuser, or the server itself)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


def start_server(bin_dir: Path, port: int = 5433) -> PgServer:
    """initdb and start a server; returns once it accepts connections."""
    root = Path(tempfile.mkdtemp(prefix="recover-pg-"))
    runas: list[str] = []
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        runas = ["runuser", "-u", "postgres", "--"]
    data, sockets = root / "data", root / "run"
    subprocess.run([*runas, "mkdir", str(data), str(sockets)], check=True)
    subprocess.run(
        [*runas, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
         "--no-sync", "-E", "UTF8"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    log = root / "server.log"
    subprocess.run([*runas, "touch", str(log)], check=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*runas, str(bin_dir / "postgres"), "-D", str(data), "-k", str(sockets),
             "-p", str(port), "-c", "listen_addresses="],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    # runuser waits for the server as its child: the server's own pid comes from its pid file.
    server = PgServer(data, sockets, port, proc.pid, runas, proc)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited at start: {log.read_text()[-2000:]}")
        with contextlib.suppress(Exception):
            server.psql("SELECT 1")
            break
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"postgres did not start in 60 s: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    server.pid = int((data / "postmaster.pid").read_text().split()[0])
    return server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL server; skipped (failed in CI) when it is not installed."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        why = f"PostgreSQL tier: PostgreSQL is not installed; {HINT}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    # A port of this worker's own: xdist workers each start one server.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    port = 15432 + int(worker.removeprefix("gw") or 0)
    server = start_server(bin_dir, port)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.data.parent, ignore_errors=True)


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session's server; dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg_server.psql(f"CREATE DATABASE {name}")
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
