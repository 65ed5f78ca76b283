"""A small client of the coordinator's HTTP API, for the operator verbs (``recover status``,
``recover incidents``, ``recover node repaired``, ``recover breaker ...``) and tests.

Errors are ours: a coordinator that does not answer is a CoordinatorUnavailableError saying how
to start one; 401/403 an AuthError; 400/404/422 a UsageError carrying the server's message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from recovery.errors import AuthError, CoordinatorUnavailableError, RecoverError, UsageError
from recovery.service.process import TOKENS_FILE, read_endpoint

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


@dataclass(frozen=True)
class Client:
    """Talks to one coordinator at ``url`` with ``token``; ``timeout_s`` per request."""

    url: str
    token: str
    timeout_s: float = 30.0

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
        return cls(url.rstrip("/"), admin_token(tokens))

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the decoded JSON answer."""
        try:
            r = httpx.request(
                method,
                f"{self.url}{path}",
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=self.timeout_s,
            )
        except httpx.TransportError as e:
            raise CoordinatorUnavailableError(
                f"the coordinator at {self.url} does not answer ({e}); {START_HINT}"
            ) from e
        if r.status_code in (401, 403):
            raise AuthError(f"{method} {path}: {r.status_code} {_message(r)}")
        if r.status_code in (400, 404, 409, 413, 422):
            raise UsageError(_message(r))
        if r.status_code >= 300:
            raise RecoverError(f"{method} {path}: {r.status_code} {_message(r)}")
        return r.json()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)


def _message(r: httpx.Response) -> str:
    try:
        doc = r.json()
    except ValueError:
        return r.text[:500]
    detail = doc.get("detail", doc) if isinstance(doc, dict) else doc
    return detail if isinstance(detail, str) else str(detail)
