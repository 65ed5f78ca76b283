"""The leader's lease as a real ``coordination.k8s.io/v1`` Lease (k8s/lease.py) on the real
kube-apiserver: the lease contract with two clients (two replicas), the object as Kubernetes'
own tools read it, and two electors over it: one leads, the other takes over once the first
stops renewing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from k8s.lease import KubeLease, parse_lease
from k8s.transport import Transport
from recovery.coordinator.leader import Elector
from recovery.errors import KubeRefusedError
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
