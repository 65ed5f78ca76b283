"""The leader's lease as a Kubernetes ``Lease`` (``coordination.k8s.io/v1``): the
:class:`~recovery.ports.lease.LeaseStore` the replicated coordinator elects its leader with.

The record maps onto the Lease's spec as Kubernetes' own leader election uses it:
``holderIdentity`` (absent once given up), ``leaseDurationSeconds`` (whole seconds, rounded
up), ``acquireTime`` (when the holder took it), ``renewTime`` and ``leaseTransitions`` (our
term is one more: the first holder's term is 1). Writes are compare-and-set on the object's
``resourceVersion``: a create that finds the Lease, or a replace of a version that changed,
answers 409, which is a :class:`~recovery.ports.lease.LeaseConflict`. The verbs are those
k8s/deploy/rbac.yaml grants the coordinator on leases in its namespace: get, create, update.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from k8s.transport import Conflict, Transport
from recovery.errors import KubeNotFoundError, KubeRefusedError
from recovery.ports.lease import LeaseConflict, LeaseRecord

API = "/apis/coordination.k8s.io/v1"


def _micro_time(wall: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    stamp = datetime.datetime.fromtimestamp(wall, tz=datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wall(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def parse_lease(obj: dict[str, Any]) -> LeaseRecord:
    """A Lease object as the API returns it -> the record. KubeRefusedError when it is not
    one (no resourceVersion)."""
    meta = obj.get("metadata") or {}
    version = meta.get("resourceVersion")
    if not version:
        raise KubeRefusedError(f"not a Lease (no metadata.resourceVersion): {str(obj)[:200]}")
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        term=int(spec.get("leaseTransitions") or 0) + 1,
        duration_s=float(spec.get("leaseDurationSeconds") or 0),
        version=str(version),
        renewed_wall=_wall(spec.get("renewTime")),
    )


class KubeLease:
    """The Lease ``name`` in ``namespace``."""

    def __init__(self, transport: Transport, namespace: str, name: str) -> None:
        self.transport = transport
        self.namespace = namespace
        self.name = name
        self._acquired: dict[str, str] = {}
        """resourceVersion -> the acquireTime it carried (kept on a renewal)."""

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    @property
    def _path(self) -> str:
        return f"{API}/namespaces/{self.namespace}/leases"

    def read(self) -> LeaseRecord | None:
        try:
            obj = self.transport.request(
                "GET", f"{self._path}/{self.name}", what=f"get {self.where}"
            )
        except KubeNotFoundError:
            return None
        return self._record(obj)

    def create(self, holder: str, duration_s: float, now_wall: float) -> LeaseRecord:
        body = self._body(holder, 1, duration_s, now_wall, acquired=now_wall)
        try:
            obj = self.transport.request("POST", self._path, what=f"create {self.where}", body=body)
        except Conflict as e:
            raise LeaseConflict(self.where) from e
        return self._record(obj)

    def update(
        self, prior: LeaseRecord, holder: str, term: int, duration_s: float, now_wall: float
    ) -> LeaseRecord:
        kept = self._acquired.get(prior.version) if holder == prior.holder else None
        body = self._body(holder, term, duration_s, now_wall, acquired=kept or now_wall)
        body["metadata"]["resourceVersion"] = prior.version
        try:
            obj = self.transport.request(
                "PUT", f"{self._path}/{self.name}", what=f"update {self.where}", body=body
            )
        except Conflict as e:
            raise LeaseConflict(self.where) from e
        except KubeNotFoundError as e:  # deleted under us: someone else's business now
            raise LeaseConflict(f"{self.where} was deleted") from e
        return self._record(obj)

    def _record(self, obj: dict[str, Any]) -> LeaseRecord:
        record = parse_lease(obj)
        acquired = (obj.get("spec") or {}).get("acquireTime")
        if acquired:
            self._acquired = {record.version: str(acquired)}
        return record

    def _body(
        self, holder: str, term: int, duration_s: float, now_wall: float, *, acquired: float | str
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "leaseDurationSeconds": max(1, math.ceil(duration_s)),
            "renewTime": _micro_time(now_wall),
            "leaseTransitions": max(0, term - 1),
        }
        if holder:
            spec["holderIdentity"] = holder
            spec["acquireTime"] = acquired if isinstance(acquired, str) else _micro_time(acquired)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
