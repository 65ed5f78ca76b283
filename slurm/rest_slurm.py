"""``RestSlurm``: the :class:`recovery.ports.slurm.SlurmControl` port over slurmrestd.

For a coordinator that cannot reach a munge socket (a pod in a Slurm-on-Kubernetes cluster).
It speaks the newest of two OpenAPI versions the daemon offers (asked of its ``/openapi/v3``
on first use): ``v0.0.44``, Slurm 25.11's newest data parser, or ``v0.0.38``, the newest
plugin of Slurm 22.05 (Debian 12's slurmrestd also loads v0.0.36/v0.0.37, with no more
requests, and the slurmdbd ones, which need slurmdbd). Most of what follows is about 22.05;
on v0.0.44 node DOWN/DRAIN/RESUME work (``POST nodes``, ``POST node/{name}``), signals reach
the batch shell only (``flags=BATCH_JOB``), submission takes typed fields
(``slurm.rest_job44``, ``--signal=B:`` and ``--requeue=expedite`` included), and only requeue
is still refused (no version has such a request; the refusal names what works instead).
Two ways in, as slurmrestd offers them:

* ``url`` (``http://host:port``) with a JWT: each request carries ``X-SLURM-USER-NAME`` and
  ``X-SLURM-USER-TOKEN`` (from ``token_file``, re-read for every request so a rotated Secret is
  picked up) and acts as that user (slurmrestd ``-a rest_auth/jwt`` with ``SLURM_JWT=daemon``,
  slurmctld with ``AuthAltTypes=auth/jwt``);
* ``socket`` (a unix socket path): with ``rest_auth/local`` every request acts as the user
  slurmrestd runs as, whoever connects (it may not run as root or SlurmUser, so with the
  default permissions it can read everything but update no node and no one else's job); a
  token may be sent over the socket too.

What slurmrestd 22.05 cannot do, and what this backend does about it:

* **Node updates** (``down``, ``drain``, ``resume`` and the ``_many`` forms): v0.0.38 has no
  request that changes a node (``POST /node/{name}`` arrived with Slurm 23.02's v0.0.39).
  They raise SlurmUnsupportedError whenever a change is needed; a no-op (the node already
  holds, someone else's reason kept) still answers False, and the ownership checks still run
  first (ReasonNotOursError). The working way on 22.05 without munge is the CLI backend with a
  JWT (``CliSlurm(jwt_file=...)``: scontrol sends ``SLURM_JWT``).
* **Requeue**: no request in v0.0.38 (nor later) requeues a job: SlurmUnsupportedError, except
  the no-op on a job that is already pending. A node set DOWN still has its requeueable jobs
  requeued by slurmctld itself.
* **Signals** go through ``DELETE /job/{id}?signal=SIG``, which slurmrestd sends with
  ``KILL_FULL_JOB``: to every step *and* to the batch shell and its children, unlike the CLI
  backend's ``scancel --batch`` (the batch shell only). The sbatch wrapper and the trainer
  take a second USR1 as the first (training gets it directly and forwarded); a child process
  without a USR1 handler would die of it.
* **Submission** translates sbatch options (``slurm.rest_job``); ``--signal=B:...`` is refused.

Everything else follows ``slurm.control`` (idempotence, ownership, re-reads after a refusal),
exactly as the CLI backend does. Errors: SlurmUnavailableError when slurmrestd or slurmctld
cannot be reached (connection refused, timeout, 502-504), SlurmRefusedError for a refusal
(including HTTP 401), SlurmUnsupportedError as above.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from recovery.errors import (
    SlurmError,
    SlurmUnavailableError,
    SlurmUnsupportedError,
    UsageError,
    unknown_choice,
)
from recovery.ports.slurm import BatchJob, JobInfo, NodeInfo, validate_job_id
from slurm import rest_parse
from slurm.control import SlurmBase
from slurm.parse import parse_jobs, parse_nodes
from slurm.rest_job import job_request
from slurm.rest_job44 import job_request44

NO_NODE_UPDATE = (
    f"slurmrestd 22.05 (OpenAPI {rest_parse.API_VERSION}) has no request that changes a node "
    "(DOWN, DRAIN, RESUME; added in Slurm 23.02's v0.0.39); use the CLI backend, which needs "
    "no munge socket when given a JWT (--slurm-backend cli --slurm-jwt-file FILE)"
)
NO_REQUEUE = (
    f"slurmrestd (OpenAPI {rest_parse.API_VERSION}) has no request that requeues a job; use "
    "the CLI backend (with --slurm-jwt-file FILE where there is no munge socket)"
)
NO_REQUEUE_44 = (
    "slurmrestd (OpenAPI v0.0.44, Slurm 25.11) has no request that requeues a job. What works "
    "instead: set its node DOWN (slurmctld requeues the node's --requeue jobs itself; this "
    "backend can), or send a `recover sbatch` job USR1 (signal_job: training saves and the "
    "batch script requeues the job), or use the CLI or pyslurm backend"
)
V38, V44 = rest_parse.API_VERSION, rest_parse.API_VERSION_44
#: What each spoken version cannot do (port methods that raise SlurmUnsupportedError).
UNSUPPORTED = {
    V38: frozenset({"down", "drain", "resume", "down_many", "drain_many", "requeue"}),
    V44: frozenset({"requeue"}),
}


class RestSlurm(SlurmBase):
    """SlurmControl through slurmrestd; see the module docstring for what 22.05 allows.

    Give exactly one of ``url`` and ``socket``. ``token_file`` and ``user`` go together (the
    JWT and the user it was made for); over ``url`` they are required. ``timeout_s`` bounds
    each request in seconds; ``env`` is what a job submitted with ``--export=ALL`` (sbatch's
    default) gets; ``transport`` replaces the HTTP transport (tests); ``clock`` gives Unix
    seconds (to tell an expired token). ``version`` is the OpenAPI version to speak (``v0.0.38``
    or ``v0.0.44``); None: the newest of those the daemon offers, asked of its
    ``/openapi/v3`` on first use (:meth:`negotiate`). Raises UsageError for a bad combination.
    """

    #: Port methods that raise SlurmUnsupportedError whenever they need to change something
    #: (v0.0.38's until the version is known; see :data:`UNSUPPORTED`).
    unsupported = UNSUPPORTED[V38]

    def __init__(
        self,
        *,
        url: str | None = None,
        socket: str | Path | None = None,
        token_file: str | Path | None = None,
        user: str | None = None,
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        version: str | None = None,
    ) -> None:
        if version is not None and version not in UNSUPPORTED:
            raise unknown_choice("slurmrestd OpenAPI version", version, UNSUPPORTED)
        if (url is None) == (socket is None):
            raise UsageError(
                "slurmrestd: give either its URL (http://HOST:PORT) or its unix socket path"
            )
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"Invalid slurmrestd URL {url!r}: expected http(s)://HOST:PORT")
        if url is not None and token_file is None:
            raise UsageError(
                f"slurmrestd at {url} authenticates by JWT: give the token file "
                "(--slurm-jwt-file; make one with `scontrol token`)"
            )
        if (token_file is None) != (user is None):
            raise UsageError(
                "a Slurm JWT and its user go together (--slurm-jwt-file, --slurm-user)"
            )
        self.where = url or f"unix:{socket}"
        self.token_file = Path(token_file) if token_file is not None else None
        self.user = user
        self.timeout_s = timeout_s
        self._env = dict(os.environ if env is None else env)
        self._clock = clock
        if transport is None and socket is not None:
            transport = httpx.HTTPTransport(uds=str(socket))
        self._http = httpx.Client(
            base_url=url or "http://slurmrestd", transport=transport, timeout=timeout_s
        )
        self._version: str | None = None
        if version is not None:
            self._speak(version)

    def _speak(self, version: str) -> None:
        self._version = version
        self.unsupported = UNSUPPORTED[version]

    @property
    def api_version(self) -> str:
        """The OpenAPI version every path is under (negotiated on first use)."""
        return self._version if self._version is not None else self.negotiate()

    def negotiate(self) -> str:
        """Pick the version to speak: v0.0.44 (Slurm 25.11) when the daemon offers it, else
        22.05's v0.0.38; returns it. Raises SlurmUnavailableError when ``/openapi/v3`` cannot
        be read, SlurmUnsupportedError when neither is offered (naming those that are)."""
        if self._version is not None:
            return self._version
        offered = self.offered()
        for version in (V44, V38):
            if version in offered:
                self._speak(version)
                return version
        raise SlurmUnsupportedError(
            f"slurmrestd at {self.where} offers {', '.join(offered) or 'no slurm API'}; this "
            f"backend speaks {V44} (Slurm 25.11) and {V38} (Slurm 22.05)"
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # --- transport ------------------------------------------------------------------------

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            return self.token_file.read_text().strip()
        except OSError as e:
            raise UsageError(f"Cannot read the Slurm JWT file {self.token_file}: {e}") from e

    def _headers(self, token: str | None) -> dict[str, str]:
        if token is None or self.user is None:
            return {}
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": token}

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        accept: Callable[[str], bool] = lambda _: False,
    ) -> str:
        """Send one request to ``path`` under ``/slurm/<api_version>``; return the reply's text
        when it succeeded (or
        ``accept(text)`` says a reply listing errors did, as a submission with a job id).

        Raises SlurmUnavailableError when slurmrestd does not answer within ``timeout_s`` or
        cannot be reached, else the error :func:`slurm.rest_parse.classify` makes of it.
        """
        what = f"{method} {path}"
        token = self._token()
        try:
            reply = self._http.request(
                method,
                f"/slurm/{self.api_version}{path}",
                params=params,
                json=body,
                headers=self._headers(token),
            )
        except httpx.TimeoutException as e:
            raise SlurmUnavailableError(
                f"{what}: slurmrestd at {self.where} gave no answer within {self.timeout_s:g} s"
            ) from e
        except httpx.TransportError as e:
            raise SlurmUnavailableError(
                f"{what}: slurmrestd unreachable at {self.where}: {type(e).__name__}: {e}"
            ) from e
        text = reply.text
        if 200 <= reply.status_code < 300 and accept(text):
            return text
        expiry = rest_parse.token_expiry(token) if token else None
        error = rest_parse.classify(
            what,
            reply.status_code,
            text,
            token_expired=expiry is not None and expiry <= self._clock(),
            version=self.api_version,
        )
        if error is None:
            return text
        if isinstance(error, SlurmUnsupportedError):
            raise SlurmUnsupportedError(f"{error}; {self._offered()}")
        raise error

    def offered(self) -> list[str]:
        """The OpenAPI versions the daemon serves (from its ``/openapi/v3``), oldest first.
        Raises SlurmUnavailableError when it cannot be read."""
        try:
            doc = self._http.get("/openapi/v3", headers=self._headers(self._token())).text
        except httpx.HTTPError as e:
            raise SlurmUnavailableError(
                f"slurmrestd unreachable at {self.where}: its /openapi/v3 could not be read "
                f"({type(e).__name__}: {e})"
            ) from e
        return rest_parse.offered_versions(doc)

    def _offered(self) -> str:
        # Only for the message of a 404: what the daemon does serve.
        try:
            versions = self.offered()
        except SlurmUnavailableError as e:
            return str(e)
        return f"it offers {', '.join(versions) or 'no slurm API'} (from /openapi/v3)"

    # --- reading --------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """All nodes, sorted by name (``GET nodes``)."""
        return parse_nodes(self.request("GET", "/nodes"), what="slurmrestd GET nodes")

    def jobs(self) -> list[JobInfo]:
        """All jobs slurmctld remembers (``GET jobs``)."""
        return parse_jobs(self.request("GET", "/jobs"), what="slurmrestd GET jobs")

    # --- raw requests (the rules around them are in SlurmBase) ----------------------------

    def _request_update(self, nodes: Sequence[str], state: str, reason: str) -> None:
        if self.api_version == V38:
            raise SlurmUnsupportedError(f"{state} of {', '.join(nodes)}: {NO_NODE_UPDATE}")
        # v0.0.44: one request for the whole group, as the CLI's `scontrol update NodeName=a,b`.
        body = {"name": list(nodes), "state": [state], "reason": reason}
        self.request("POST", "/nodes", body=body)

    def _request_resume(self, node: str) -> None:
        if self.api_version == V38:
            raise SlurmUnsupportedError(f"resume of {node}: {NO_NODE_UPDATE}")
        self.request("POST", f"/node/{node}", body={"state": ["RESUME"]})

    def _request_requeue(self, job_id: str) -> None:
        why = NO_REQUEUE if self.api_version == V38 else NO_REQUEUE_44
        raise SlurmUnsupportedError(f"requeue of job {job_id}: {why}")

    def _request_release(self, job_id: str) -> None:
        # A job Slurm 25.11 held after an expedited requeue (v0.0.38 never meets one).
        self.request("POST", f"/job/{job_id}", body={"hold": False})

    def _request_signal(self, job_id: str, signal: str) -> None:
        if self.api_version == V38:
            # KILL_FULL_JOB on slurmrestd's side: every step, the batch shell and its children.
            self.request("DELETE", f"/job/{job_id}", params={"signal": signal})
            return
        # v0.0.44 takes the flags: the batch shell only, as the CLI's `scancel --batch`.
        self.request("DELETE", f"/job/{job_id}", params={"signal": signal, "flags": "BATCH_JOB"})

    def _request_cancel(self, job_id: str) -> None:
        self.request("DELETE", f"/job/{job_id}")

    def submit(self, job: BatchJob) -> str:
        """Submit ``job`` (``POST job/submit``); return the new job id. Raises UsageError for
        an option slurmrestd does not take, SlurmUnsupportedError for ``--signal=B:...`` on
        v0.0.38 (see ``slurm.rest_job``; v0.0.44 takes it: ``slurm.rest_job44``),
        SlurmRefusedError when slurmctld refuses the job."""
        if self.api_version == V38:
            body = job_request(job, self._env)
        else:
            body = job_request44(job, self._env)
        text = self.request(
            "POST",
            "/job/submit",
            body=body,
            accept=lambda t: rest_parse.submitted_job_id(t) is not None,
        )
        job_id = rest_parse.submitted_job_id(text)
        if job_id is None:
            raise SlurmError(f"POST /job/submit answered without a job_id: {text[:200]!r}")
        return validate_job_id(job_id)


def connect(**kwargs: Any) -> RestSlurm:
    """A :class:`RestSlurm` (same arguments) that has already asked the daemon which version
    to speak (:meth:`RestSlurm.negotiate`), so its ``unsupported`` is that version's. Raises
    as the constructor and :meth:`RestSlurm.negotiate` do."""
    ctl = RestSlurm(**kwargs)
    try:
        ctl.negotiate()
    except BaseException:
        ctl.close()
        raise
    return ctl
