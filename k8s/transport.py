"""One way to talk to the API server: raw JSON over the official client's connection (its TLS,
its kubeconfig or in-cluster credentials), with our errors.

We skip the client's model classes on purpose: the parsers in :mod:`k8s.parse` read the
server's JSON as it is (tested on literal objects), patches go out with the content type we
choose (the generated client would default to JSON Patch), and a watch is read line by line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from k8s.errors import classify
from recovery.errors import KubeRefusedError, UsageError

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

Query = Sequence[tuple[str, str | int | bool]]


class Conflict(Exception):
    """409: the object changed since it was read. Raised to the caller, which reads again."""


def api_client(
    kubeconfig: Path | None = None, *, in_cluster: bool = False, retries: int | None = None
) -> client.ApiClient:
    """An ApiClient for the cluster: in-cluster (the pod's ServiceAccount) or from the
    kubeconfig at ``kubeconfig`` (None: ``$KUBECONFIG`` or ``~/.kube/config``). ``retries``:
    how often a failed connection or read is tried again inside one request (None: the
    client's default, 3: a request may then take four timeouts).

    Raises UsageError saying what is missing when neither works.
    """
    conf = client.Configuration()
    if retries is not None:
        conf.retries = retries
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        else:
            path = str(kubeconfig) if kubeconfig is not None else None
            config.load_kube_config(config_file=path, client_configuration=conf)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as e:
        where = "in-cluster (no ServiceAccount mounted?)" if in_cluster else f"{kubeconfig}"
        raise UsageError(f"cannot configure the Kubernetes client from {where}: {e}") from e
    return client.ApiClient(configuration=conf)


class Transport:
    """JSON requests to one API server. ``timeout_s`` bounds connecting and each read (s)."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float = 10.0) -> None:
        self.api = api
        self.timeout_s = timeout_s

    def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Query = (),
        body: Any = None,
        content_type: str | None = None,
        read_timeout_s: float | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        try:
            request = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            read = self.timeout_s if read_timeout_s is None else read_timeout_s
            resp = self.api.call_api(*request, _request_timeout=(self.timeout_s, read))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise classify(e, what) from e
        if not 200 <= resp.status <= 299:
            try:
                text = resp.response.data.decode("utf-8", errors="replace")
            except (urllib3.exceptions.HTTPError, OSError):
                text = ""
            error = ApiException(status=resp.status, reason=resp.reason, body=text)
            if resp.status == 409:
                raise Conflict(what) from error
            raise classify(error, what) from error
        return resp

    def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Query = (),
        body: Any = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        """Send one request and return the JSON object it answered.

        Raises :class:`Conflict` for 409, else our errors (:func:`k8s.errors.classify`):
        KubeNotFoundError (404), KubeForbiddenError (403), KubeRefusedError (other 4xx),
        KubeUnavailableError (5xx, 429, transport).
        """
        resp = self._send(
            method, path, what=what, query=query, body=body, content_type=content_type
        )
        try:
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise classify(e, what) from e
        try:
            parsed = json.loads(data) if data else {}
        except ValueError as e:  # a proxy's error page, a truncated body
            raise KubeRefusedError(f"{what}: the answer is not JSON: {data[:200]!r}") from e
        return dict(parsed) if isinstance(parsed, Mapping) else {"items": parsed}

    def lines(self, path: str, *, what: str, query: Query, read_timeout_s: float) -> Iterator[str]:
        """A streamed response (a watch) line by line, until the server ends it. A read that
        stalls past ``read_timeout_s`` is a KubeUnavailableError."""
        resp = self._send("GET", path, what=what, query=query, read_timeout_s=read_timeout_s)
        raw = resp.response
        try:
            for line in raw:
                text = line.decode("utf-8", errors="replace").strip()
                if text:
                    yield text
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise classify(e, what) from e
        finally:
            raw.release_conn()
