"""A real local Kubernetes API server: etcd and kube-apiserver v1.20.2 on loopback.

For tests and demos only: no kubelet, scheduler or controller-manager runs, so Node and Pod
objects are just records (pods bound to a node stay Pending; nobody finalizes a namespace being
deleted; a graceful pod delete only sets ``deletionTimestamp`` - pass ``grace_period_seconds=0``
to remove one at once). RBAC is on (``--authorization-mode=Node,RBAC``); the admin authenticates
with a static bearer token (group ``system:masters``); ServiceAccount tokens come from the
TokenRequest API (``create_namespaced_service_account_token``).

The binaries come from ``scripts/build-kube.sh`` (see :func:`find_binaries`); etcd is Debian's
``etcd-server``. State dir layout (the server's data is wiped at every start)::

    STATE_DIR/apiserver.json     url, ports and pids while it runs
    STATE_DIR/pki/               CA, serving cert, SA keys, admin token (k8s.localpki)
    STATE_DIR/etcd/              etcd's data
    STATE_DIR/admin.kubeconfig   a kubeconfig for the admin
    STATE_DIR/log/{etcd,kube-apiserver}.log
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kclient

from k8s.localpki import Pki, make_pki
from recovery import fsutil, proc
from recovery.errors import ClusterError, RecoverError

KUBE_VERSION = "v1.20.2"
DEFAULT_CACHE = Path("/var/cache/slurm-k8s-recover/kube")
STATE_FILE = "apiserver.json"
SERVICE_CIDR = "10.0.0.0/24"
BUILD_HINT = "./scripts/build-kube.sh (about 5 min once, then cached; ./scripts/setup.sh runs it)"


class KubeNotBuiltError(RecoverError):
    """kube-apiserver/kubectl are not built here, or Debian's etcd is not installed."""

    exit_code = 5


@dataclass(frozen=True)
class KubeBinaries:
    apiserver: Path
    kubectl: Path
    etcd: Path


def bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where scripts/build-kube.sh puts the binaries: ``$KUBE_BIN_DIR``, else
    ``$KUBE_CACHE/v1.20.2/bin`` (``KUBE_CACHE`` defaults to /var/cache/slurm-k8s-recover/kube)."""
    env = os.environ if env is None else env
    if env.get("KUBE_BIN_DIR"):
        return Path(env["KUBE_BIN_DIR"])
    return Path(env.get("KUBE_CACHE") or DEFAULT_CACHE) / KUBE_VERSION / "bin"


def find_binaries(env: Mapping[str, str] | None = None) -> KubeBinaries:
    """The built kube-apiserver and kubectl and Debian's etcd. Raises KubeNotBuiltError
    saying what is missing and how to get it."""
    d = bin_dir(env)
    missing = [str(d / n) for n in ("kube-apiserver", "kubectl") if not os.access(d / n, os.X_OK)]
    etcd = shutil.which("etcd")
    problems = []
    if missing:
        problems.append(f"{', '.join(missing)} not built: run {BUILD_HINT}")
    if etcd is None:
        problems.append("etcd not installed: apt-get install etcd-server")
    if problems:
        raise KubeNotBuiltError("; ".join(problems))
    assert etcd is not None
    return KubeBinaries(d / "kube-apiserver", d / "kubectl", Path(etcd))


@dataclass(frozen=True)
class ApiServerInfo:
    """A running (or recorded) local API server."""

    state_dir: Path
    url: str
    """``https://127.0.0.1:PORT``."""
    etcd_url: str
    pids: dict[str, int]
    """``etcd`` and ``kube-apiserver``."""

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca_cert

    @property
    def admin_token(self) -> str:
        return self.pki.admin_token()

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig."""
        return self.state_dir / "admin.kubeconfig"

    def client(self, token: str | None = None) -> kclient.ApiClient:
        """An ApiClient for ``token`` (default: the admin's); the caller closes it."""
        cfg = kclient.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_cert)
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return kclient.ApiClient(cfg)


class LocalApiServer:
    """Start, inspect and stop etcd + kube-apiserver rooted at ``state_dir``.

    ``clock``/``sleep`` are injected so waiting logic can be driven by tests.
    """

    def __init__(
        self,
        state_dir: Path | str,
        *,
        binaries: KubeBinaries | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.state_dir = Path(state_dir).absolute()
        self._binaries = binaries
        self._clock = clock
        self._sleep = sleep

    def info(self) -> ApiServerInfo | None:
        """The recorded server, or None when none was started here (or it was stopped)."""
        return fsutil.read_json(self.state_dir / STATE_FILE, self._info, error=ClusterError)

    def _info(self, raw: Any) -> ApiServerInfo:
        pids = {k: int(v) for k, v in raw["pids"].items()}
        return ApiServerInfo(self.state_dir, raw["url"], raw["etcd_url"], pids)

    def _record(self, info: ApiServerInfo) -> None:
        data = {"url": info.url, "etcd_url": info.etcd_url, "pids": info.pids}
        text = json.dumps(data, indent=2) + "\n"
        fsutil.atomic_write(self.state_dir / STATE_FILE, text.encode())

    def start(self, *, timeout_s: float = 120.0) -> ApiServerInfo:
        """Start etcd and kube-apiserver on free loopback ports with an empty store, and return
        once ``/readyz`` answers ok (about 5 s on an idle machine). A no-op when both already
        run here.

        Raises KubeNotBuiltError when a binary is missing, ClusterError (with the logs' tails)
        when a process exits or the server is not ready within ``timeout_s`` seconds. A port
        taken by someone else between choosing and binding it is retried with new ports.
        """
        current = self.info()
        if current is not None and all(proc.alive(p) for p in current.pids.values()):
            return current
        binaries = self._binaries or find_binaries()
        self.stop()
        for attempt in range(3):
            try:
                return self._start(binaries, timeout_s)
            except _PortTaken:
                self.stop()
                if attempt == 2:
                    raise ClusterError(f"ports kept being taken;\n{self._logs()}") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start(self, b: KubeBinaries, timeout_s: float) -> ApiServerInfo:
        d = self.state_dir
        shutil.rmtree(d / "etcd", ignore_errors=True)
        (d / "log").mkdir(parents=True, exist_ok=True)
        (d / "etcd").mkdir(mode=0o700)
        for log in (d / "log").glob("*.log"):
            log.unlink()
        pki = make_pki(d / "pki")
        etcd_port, peer_port, api_port = proc.free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        info = ApiServerInfo(d, f"https://127.0.0.1:{api_port}", etcd_url, {})
        write_kubeconfig(info.kubeconfig, server=info.url, ca_cert=pki.ca_cert,
                         token=pki.admin_token(), user="admin")  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(d)}
        # Record before each start, so a failure half-way still lets stop() find everything.
        self._record(info)
        info.pids["etcd"] = proc.spawn(
            [str(b.etcd), "--name=local", f"--data-dir={d / 'etcd'}",
             f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
             f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
             f"--initial-cluster=local={peer_url}", "--logger=zap", "--log-level=warn"],
            env, d / "log" / "etcd.log",
        )  # fmt: skip
        self._record(info)
        self._wait(info, f"{etcd_url}/health", None, timeout_s)
        info.pids["kube-apiserver"] = proc.spawn(
            [str(b.apiserver), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
             "--advertise-address=127.0.0.1", f"--secure-port={api_port}", "--insecure-port=0",
             f"--cert-dir={d / 'pki'}",
             f"--tls-cert-file={pki.server_cert}", f"--tls-private-key-file={pki.server_key}",
             f"--client-ca-file={pki.ca_cert}", f"--token-auth-file={pki.token_file}",
             "--authorization-mode=Node,RBAC",
             "--service-account-issuer=https://kubernetes.default.svc",
             f"--service-account-key-file={pki.sa_pub}",
             f"--service-account-signing-key-file={pki.sa_key}",
             f"--service-cluster-ip-range={SERVICE_CIDR}",
             # No controller-manager runs to create the `default` ServiceAccounts this
             # admission plugin insists on.
             "--disable-admission-plugins=ServiceAccount",
             "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
             "-v=1"],
            env, d / "log" / "kube-apiserver.log",
        )  # fmt: skip
        self._record(info)
        self._wait(info, f"{info.url}/readyz", pki, timeout_s)
        return info

    def _wait(self, info: ApiServerInfo, url: str, pki: Pki | None, timeout_s: float) -> None:
        """Poll ``url`` until it answers 200, failing fast when a started process exits."""
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert)) if pki else None
        headers = {"Authorization": f"Bearer {pki.admin_token()}"} if pki else {}
        deadline = self._clock() + timeout_s
        last = "no answer yet"
        while True:
            dead = [k for k, p in info.pids.items() if not proc.alive(p)]
            if dead:
                logs = self._logs()
                if "address already in use" in logs:
                    raise _PortTaken
                raise ClusterError(f"{', '.join(dead)} exited during start;\n{logs}")
            try:
                req = urllib.request.Request(url, headers=headers)  # noqa: S310 (our own URL)
                with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read(300).decode(errors='replace')}"
            except (OSError, ValueError) as e:
                last = str(e)
            if self._clock() > deadline:
                raise ClusterError(
                    f"{url} not ready within {timeout_s:g} s ({last});\n{self._logs()}"
                )
            self._sleep(0.2)

    def _logs(self, lines: int = 15) -> str:
        out = []
        for log in sorted((self.state_dir / "log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log}\n" + "\n".join(tail))
        return "\n".join(out)

    def processes(self) -> set[int]:
        """Pids of every live process whose command line names this state dir (what stop()
        must leave at zero)."""
        mark = str(self.state_dir).encode()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if mark + b"/" in cmdline and proc.alive(int(entry.name)):
                found.add(int(entry.name))
        return found

    def stop(self, *, grace_s: float = 10.0) -> list[str]:
        """SIGTERM kube-apiserver, then etcd (each a process we started: its command line
        names this state dir, so a reused pid is left alone), SIGKILL after ``grace_s``
        seconds. Returns the names that were running. A no-op when nothing runs here."""
        info = self.info()
        pids = info.pids if info else {}
        mine = self.processes()
        was_running = sorted(k for k, p in pids.items() if p in mine)
        # The API server first, so it does not log a burst of etcd errors on the way down.
        for name in ("kube-apiserver", "etcd"):
            pid = pids.get(name)
            if pid is not None and pid in mine:
                self._terminate(pid, grace_s)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        return was_running

    def _terminate(self, pid: int, grace_s: float) -> None:
        _signal(pid, signal.SIGTERM)
        deadline = self._clock() + grace_s
        while proc.alive(pid):
            if self._clock() > deadline:
                _signal(pid, signal.SIGKILL)
                deadline = self._clock() + grace_s
            self._sleep(0.05)


class _PortTaken(Exception):
    """A daemon could not bind the port chosen for it."""


def write_kubeconfig(
    path: Path, *, server: str, ca_cert: Path, token: str, user: str, context: str = "local"
) -> Path:
    """Write a kubeconfig (mode 0600) for ``token`` at ``server`` trusting ``ca_cert``; returns
    ``path``. ``user`` only names the entry."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server,
                                                     "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": user}}],
        "current-context": context,
    }  # fmt: skip
    fsutil.atomic_write(path, yaml.safe_dump(doc, sort_keys=False).encode())
    os.chmod(path, 0o600)
    return path


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


