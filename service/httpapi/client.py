"""A small client of the coordinator's HTTP API, for the operator verbs (``recover status``,
``recover incidents``, ``recover node repaired``, ``recover breaker ...``), ``recover inject``
(:func:`inject`), the scenario runner and tests.

Errors are ours: a coordinator that does not answer is a CoordinatorUnavailableError saying how
to start one; 401/403 an AuthError; 400/404/422 a UsageError carrying the server's message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from recovery.errors import AuthError, CoordinatorUnavailableError, RecoverError, UsageError
from recovery.httpbody import error_reason
from recovery.statedir import TOKENS_FILE, read_endpoint

START_HINT = (
    "start one with `recover coordinator serve --state-dir DIR` "
    "(or `recover cluster up --coordinator`), or point at one with --coordinator URL"
)


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$RECOVER_STATE_DIR/coordinator`` when set, else ``./.state/coordinator``."""
    env = os.environ if env is None else env
    base = Path(env["RECOVER_STATE_DIR"]) if env.get("RECOVER_STATE_DIR") else Path(".state")
    return (base / "coordinator").absolute()


def admin_token(path: Path) -> str:
    """The admin token from a tokens file (lines ``admin TOKEN`` / ``node NAME TOKEN``)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read the tokens file {path}: {e}") from e
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "admin":
            return parts[1]
    raise UsageError(f"no admin token in {path} (expected a line 'admin TOKEN')")


#: How long a request to several coordinator replicas keeps trying while none leads (a
#: takeover: the new leader acts within about 5 s of the old one's death).
FAILOVER_S = 15.0


def replica_urls(url: str) -> list[str]:
    """``URL[,URL...]`` -> the URLs, without trailing slashes."""
    return [u.strip().rstrip("/") for u in url.split(",") if u.strip()]


@dataclass(frozen=True)
class Client:
    """Talks to the coordinator at ``url`` with ``token``; ``timeout_s`` per request.
    ``url`` may list several replicas (``URL,URL``): a request goes to each in turn until
    one answers as the leader, and keeps going round for up to ``failover_s`` seconds while
    none does (the leader died and a standby is taking over)."""

    url: str
    token: str
    timeout_s: float = 30.0
    failover_s: float = FAILOVER_S

    @classmethod
    def locate(cls, url: str | None, token_file: Path | None, state_dir: Path | None) -> Client:
        """The coordinator named by ``--coordinator`` / ``$RECOVER_COORDINATOR``, else the one
        recorded in the state dir; its admin token from ``--token-file`` or the state dir."""
        sd = state_dir or default_state_dir()
        url = url or os.environ.get("RECOVER_COORDINATOR")
        if not url:
            ep = read_endpoint(sd)
            if ep is None:
                raise CoordinatorUnavailableError(
                    f"no coordinator is running in {sd}; {START_HINT}"
                )
            url = ep.url
        tokens = token_file or (
            Path(os.environ["RECOVER_TOKEN_FILE"])
            if os.environ.get("RECOVER_TOKEN_FILE")
            else sd / TOKENS_FILE
        )
        return cls(",".join(replica_urls(url)), admin_token(tokens))

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the decoded JSON answer."""
        urls = replica_urls(self.url)
        if len(urls) <= 1:
            return self._answer(method, path, self._send(self.url, method, path, body))
        deadline = time.monotonic() + self.failover_s
        while True:
            refusals = []
            for url in urls:
                try:
                    r = self._send(url, method, path, body)
                except CoordinatorUnavailableError as e:
                    refusals.append(str(e))
                    continue
                if r.status_code == 503:  # a standby, or a replica whose journal failed
                    refusals.append(f"{url}: {error_reason(r.text)}")
                    continue
                return self._answer(method, path, r)
            if time.monotonic() >= deadline:
                raise CoordinatorUnavailableError(
                    f"no coordinator replica leads after {self.failover_s:g} s: "
                    + "; ".join(refusals)
                )
            time.sleep(0.25)

    def _send(self, url: str, method: str, path: str, body: Any) -> httpx.Response:
        try:
            return httpx.request(
                method,
                f"{url}{path}",
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=self.timeout_s,
            )
        except httpx.TransportError as e:
            raise CoordinatorUnavailableError(
                f"the coordinator at {url} does not answer ({e}); {START_HINT}"
            ) from e

    def _answer(self, method: str, path: str, r: httpx.Response) -> Any:
        if r.status_code in (401, 403):
            raise AuthError(f"{method} {path}: {r.status_code} {error_reason(r.text)}")
        if r.status_code in (400, 404, 409, 413, 422):
            raise UsageError(error_reason(r.text))
        if r.status_code >= 300:
            raise RecoverError(f"{method} {path}: {r.status_code} {error_reason(r.text)}")
        return r.json()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)


def inject(
    client: Client,
    *,
    fault: str,
    node: str,
    gpu: int | None = None,
    via: str = "agent",
    wait: bool = False,
    wait_timeout_s: float = 60.0,
    poll_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Ask the coordinator to have ``node``'s agent inject ``fault``; returns the reply
    (``event_id``, ``command``, ...), with ``decision`` added when ``wait``.

    Raises UsageError (unknown fault or node, agent not connected: the message says which and
    what is valid), AuthError, CoordinatorUnavailableError, RecoverError when the agent did not
    carry it out in time or ``wait`` sees no decision within ``wait_timeout_s`` seconds.
    """
    if via not in ("agent", "kmsg"):
        raise UsageError(f"Unknown path {via!r}. Known: agent, kmsg")
    body = {"fault": fault, "node": node, "gpu": gpu, "via": via}
    reply: dict[str, Any] = client.post("/v1/inject", body)
    if wait:
        reply["decision"] = wait_decision(
            client, reply.get("event_id"), wait_timeout_s, poll_s, sleep, monotonic
        )
    return reply


def wait_decision(
    client: Client,
    event_id: str | None,
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> dict[str, Any]:
    """Poll ``GET /v1/events/{id}/decision`` until the decision exists, then its incident
    until no action of it is still ``planned`` (applied, failed, held by the breaker or
    waiting for a spare), then the coordinator's status until its view of Slurm is newer than
    those actions: once this returns, ``recover status`` shows what the coordinator did.
    Returns the decision. An incident the coordinator does not show (none opened) ends the
    wait."""
    if not event_id:
        raise UsageError(
            "the agent could not tell the event id (kernel-log injection into /dev/kmsg); "
            "look for the injection marker with `recover incidents` instead of --wait"
        )
    deadline = monotonic() + timeout_s
    stored = False
    while True:
        doc = client.get(f"/v1/events/{event_id}/decision")
        stored = bool(doc.get("stored"))
        if doc.get("decision") is not None:
            decision: dict[str, Any] = doc["decision"]
            _wait_actions(client, decision.get("incident"), deadline, poll_s, sleep, monotonic)
            return decision
        if monotonic() >= deadline:
            raise RecoverError(
                f"no decision on event {event_id} within {timeout_s:g} s "
                f"({'it is in the journal' if stored else 'it has not reached the journal'})"
            )
        sleep(poll_s)


def _wait_actions(
    client: Client,
    incident: str | None,
    deadline: float,
    poll_s: float,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> None:
    """Poll ``incident`` until none of its actions is ``planned`` (see :func:`wait_decision`)."""
    if not incident:
        return
    while True:
        try:
            doc = client.get(f"/v1/incidents/{incident}")
        except UsageError:  # not shown: nothing of it to wait for
            return
        planned = [a for a in doc.get("actions", []) if a.get("status") == "planned"]
        if not planned:
            _wait_seen(client, doc.get("actions", []), deadline, poll_s, sleep, monotonic)
            return
        if monotonic() >= deadline:
            kinds = ", ".join(str(a.get("kind", "?")) for a in planned)
            raise RecoverError(
                f"incident {incident} was decided, but its actions ({kinds}) were not applied "
                "in time; `recover incidents " + incident + "` shows where they stand"
            )
        sleep(poll_s)


def _wait_seen(
    client: Client,
    actions: list[dict[str, Any]],
    deadline: float,
    poll_s: float,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> None:
    """Poll ``GET /v1/status`` until the coordinator's view of Slurm (``seen_at``) was read
    after the last of ``actions`` finished: ``recover status`` shows that view, so it then
    shows what the actions did. Gives up quietly at ``deadline`` (the actions are done)."""
    finished = [
        float(a["finished"]["wall"]) for a in actions if isinstance(a.get("finished"), dict)
    ]
    if not finished:
        return
    while monotonic() < deadline:
        seen = client.get("/v1/status").get("seen_at")
        if seen is not None and float(seen) >= max(finished):
            return
        sleep(poll_s)
