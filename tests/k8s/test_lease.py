"""The leader's lease as a real ``coordination.k8s.io/v1`` Lease (k8s/lease.py) on the real
kube-apiserver: the lease contract with two clients (two replicas), the object as Kubernetes'
own tools read it, and two electors over it: one leads, the other takes over once the first
stops renewing."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from k8s.lease import KubeLease, parse_lease
from k8s.localapi import write_kubeconfig
from k8s.transport import Transport
from recovery.coordinator.leader import Elector
from recovery.errors import KubeRefusedError
from service.wiring import KubeOptions, LeaseOptions, lease_store
from tests.lease_contract import check_lease_store
from tests.plugins.kube_api import KubeApi

pytestmark = pytest.mark.kube

NAMESPACE = "recover"


@pytest.fixture
def lease_name(kube_api: KubeApi) -> Iterator[str]:
    """A fresh Lease name in namespace ``recover`` (made when absent); the Lease is deleted
    afterwards."""
    kube_api.ensure_namespace(NAMESPACE)
    name = f"recover-test-{uuid.uuid4().hex[:8]}"
    yield name
    kube_api.kubectl("delete", "lease", name, "-n", NAMESPACE, "--ignore-not-found")


def _lease(kube_api: KubeApi, name: str) -> KubeLease:
    return KubeLease(Transport(kube_api.admin_client()), NAMESPACE, name)


def test_two_clients_keep_the_lease_contract(kube_api: KubeApi, lease_name: str) -> None:
    check_lease_store(_lease(kube_api, lease_name), _lease(kube_api, lease_name))
    shown = kube_api.kubectl("get", "lease", lease_name, "-n", NAMESPACE, "-o", "json")
    assert '"leaseTransitions": 1' in shown.stdout  # term 2: one transition
    assert "holderIdentity" not in shown.stdout  # given up


def test_one_elector_leads_and_the_other_takes_over_when_it_stops(
    kube_api: KubeApi, lease_name: str
) -> None:
    a = Elector(_lease(kube_api, lease_name), "replica-a", time.monotonic, time.time,
                duration_s=3, renew_deadline_s=2, retry_s=0.5)  # fmt: skip
    b = Elector(_lease(kube_api, lease_name), "replica-b", time.monotonic, time.time,
                duration_s=3, renew_deadline_s=2, retry_s=0.5)  # fmt: skip
    assert a.tick().leading
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # both tick: a renews, b waits
        renewed = time.monotonic()  # a's last renewal starts here
        assert a.tick().leading
        assert not b.tick().leading
        time.sleep(0.5)
    shown = kube_api.kubectl("get", "lease", lease_name, "-n", NAMESPACE,
                             "-o", "jsonpath={.spec.holderIdentity}")  # fmt: skip
    assert shown.stdout == "replica-a"
    # a stops renewing (a dead process): b takes over once it has seen a's last record
    # unchanged for the 3 s duration (b first saw it after a wrote it), within a few ticks.
    while not b.tick().leading:
        assert time.monotonic() - renewed < 12, "b never took over"
        time.sleep(0.5)
    took = time.monotonic() - renewed
    assert 3 <= took < 12, took
    assert b.term == 2
    assert not a.may_act()  # a's last renewal is older than its deadline
    assert not a.tick().leading  # back, a finds b's record


def test_an_object_that_is_not_a_lease_is_refused_by_name() -> None:
    with pytest.raises(KubeRefusedError, match="not a Lease"):
        parse_lease({"spec": {}})
    record = parse_lease({
        "metadata": {"resourceVersion": "7"},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15, "leaseTransitions": 4,
                 "renewTime": "2026-12-07T10:00:00.250000Z"},
    })  # fmt: skip
    assert (record.holder, record.term, record.duration_s, record.version) == ("x", 5, 15.0, "7")
    assert record.renewed_wall == pytest.approx(1796637600.25)


class Cuttable:
    """A TCP proxy in front of the apiserver that can be cut: while cut, every connection
    open through it is closed and new ones are accepted and never answered (requests time
    out), as when the network to the apiserver fails."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.cut = threading.Event()
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
            if self.cut.is_set():
                continue  # held open, never answered
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._open.append(up)
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if self.cut.is_set():
                    break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def set_cut(self, cut: bool) -> None:
        if cut:
            self.cut.set()
            with self._lock:
                conns, self._open = self._open, []
            for s in conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        else:
            self.cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.set_cut(True)
        self._server.close()


@pytest.mark.slow
def test_the_apiserver_unreachable_for_30_s_never_makes_two_leaders(
    kube_api: KubeApi, lease_name: str, tmp_path: Path
) -> None:
    """Both replicas lose the apiserver for 30 s: the leader stops acting within its renew
    deadline (plus one request's timeout), nobody acts while it is gone, and once it is back
    exactly one replica leads, at a term no lower than before. The lease is made as
    ``recover coordinator serve --lease kube --kubeconfig ...`` makes it, with the shipped
    timings."""
    host = urllib.parse.urlsplit(kube_api.url)
    proxy = Cuttable((host.hostname or "127.0.0.1", host.port or 443))
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", server=f"https://127.0.0.1:{proxy.port}",
        ca_cert=kube_api.ca_cert, token=kube_api.info.admin_token, user="admin",
    )  # fmt: skip
    electors = []
    for name in ("replica-a", "replica-b"):
        opts = LeaseOptions(kind="kube", identity=name, namespace=NAMESPACE, name=lease_name)
        lease = lease_store(opts, KubeOptions(kubeconfig=kubeconfig), tmp_path / "unused")
        electors.append(Elector(lease, name, time.monotonic, time.time))
    a, b = electors
    assert (a.duration_s, a.renew_deadline_s, a.retry_s) == (4.0, 2.5, 0.5)
    try:
        assert a.tick().leading
        for _ in range(3):
            assert not b.tick().leading
            assert a.tick().leading
            time.sleep(0.5)
        term = a.term
        proxy.set_cut(True)
        cut_at = time.monotonic()
        acting_seen: list[tuple[float, list[str]]] = []
        while time.monotonic() - cut_at < 30:
            for e in electors:
                e.tick()
                acting = [x.identity for x in electors if x.may_act()]
                assert len(acting) <= 1, acting
                acting_seen.append((time.monotonic() - cut_at, acting))
            time.sleep(0.5)
        # a stopped acting once its last renewal (before the cut) was 2.5 s old: seen at
        # the latest one request (1.25 s, no retries) after that.
        late = [(t, who) for t, who in acting_seen if who and t > 2.5 + 1.25]
        assert late == [], late
        proxy.set_cut(False)
        back = time.monotonic()
        while not any(e.may_act() for e in electors):
            assert time.monotonic() - back < 20, "nobody leads after the apiserver came back"
            for e in electors:
                e.tick()
                assert sum(x.may_act() for x in electors) <= 1
            time.sleep(0.5)
        (leader,) = [e for e in electors if e.may_act()]
        assert leader.term >= term
        shown = kube_api.kubectl("get", "lease", lease_name, "-n", NAMESPACE,
                                 "-o", "jsonpath={.spec.holderIdentity}")  # fmt: skip
        assert shown.stdout == leader.identity
    finally:
        proxy.close()
