"""The Kubernetes client's errors as ours: transport failures are transient, answers are verdicts.

Why each status is or is not retried:

* 409 Conflict: someone wrote the object between our read and our write; the caller reads
  again and recomputes (:class:`k8s.nodes.KubeControl` does), so it never reaches here as a
  verdict unless the retries ran out.
* 429 Too Many Requests (API priority and fairness, or a PodDisruptionBudget refusing an
  eviction) and 5xx: the server is busy or failing over; the same request may pass later.
* 403 Forbidden: RBAC said no; asking again gives the same answer until someone changes the
  ServiceAccount's role, so it is a verdict that names the verb and the resource.
* 400/422: the request itself is wrong; a verdict.
* 404: the caller decides whether "gone" means done (a pod to delete) or an error.
"""

from __future__ import annotations

import json

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from recovery.errors import (
    KubeError,
    KubeForbiddenError,
    KubeNotFoundError,
    KubeRefusedError,
    KubeUnavailableError,
    RecoverError,
)

RBAC_HINT = "grant it in k8s/deploy/rbac.yaml (the coordinator's ClusterRole and Role)"


def api_message(e: ApiException) -> str:
    """The server's own words: the Status object's ``message`` when the body is one."""
    try:
        body = json.loads(e.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except ValueError:
        pass
    return str(e.reason or e.body or "no message")


def status_of(e: BaseException) -> int | None:
    """The HTTP status of an API error, None for anything else."""
    return int(e.status) if isinstance(e, ApiException) and e.status else None


def classify(e: BaseException, what: str) -> RecoverError:
    """Our error for a failure of ``what`` (``"patch nodes node1"``: the verb, the resource and
    the object, so a 403 says which permission is missing)."""
    if isinstance(e, ApiException):
        status = int(e.status or 0)
        msg = api_message(e)
        if status == 403:
            return KubeForbiddenError(f"{what}: forbidden (403): {msg}; {RBAC_HINT}")
        if status == 404:
            return KubeNotFoundError(f"{what}: not found (404): {msg}")
        if status == 429 or status >= 500 or status == 0:
            return KubeUnavailableError(f"{what}: API server busy ({status}): {msg}", delay=1.0)
        return KubeRefusedError(f"{what}: refused ({status}): {msg}")
    if isinstance(e, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return KubeUnavailableError(f"{what}: API server unreachable: {e}", delay=1.0)
    if isinstance(e, ConfigException):
        return KubeError(f"{what}: Kubernetes client configuration: {e}")
    return KubeError(f"{what}: {type(e).__name__}: {e}")
