"""Pure functions for slurmrestd's replies: errors, their classification, versions, tokens.

Shapes are those of Debian 12's slurmrestd (Slurm 22.05.8, OpenAPI plugin ``v0.0.38``), as
captured in ``tests/slurm/samples/rest-22.05/``. Node and job lists have the same shape as
``sinfo --json`` / ``squeue --json`` (``slurm.parse`` reads both). What matters here:

* Every JSON reply carries ``errors``: entries with ``error`` (text) and one of
  ``error_number``, ``error_code`` or ``errno``, sometimes a ``description``.
* A refusal usually comes with HTTP 500 (``Invalid job id specified``, 2017) or 400 (a request
  slurmrestd could not parse, whose entries may say errno -1 too); an unreachable slurmctld
  with 500 and either its text
  (``Unable to contact slurm controller``, 1800) or a bare ``Unspecified error`` (errno -1),
  which 22.05 also answers when slurmctld rejects the JWT: the two cannot be told apart from
  the reply, so errno -1 counts as transient unless the token has expired.
* A successful submission may still list ``errors`` (``Job is in held state, pending
  scheduler release``): the ``job_id`` decides.
* A missing credential is HTTP 401 with a plain-text body; an unknown path (a plugin version
  the daemon does not load) is 404 with a plain-text body.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from recovery.errors import (
    SlurmError,
    SlurmRefusedError,
    SlurmUnavailableError,
    SlurmUnsupportedError,
)
from slurm.parse import UNREACHABLE

#: The OpenAPI plugin version this backend speaks (Slurm 22.05's newest).
API_VERSION = "v0.0.38"

#: Slurm 25.11's newest data parser (``slurm.rest_slurm44``).
API_VERSION_44 = "v0.0.44"
#: Which Slurm each spoken version is the newest of.
SLURM_OF = {API_VERSION: "Slurm 22.05", API_VERSION_44: "Slurm 25.11"}

#: Slurm error numbers meaning slurmctld was not reached (SLURMCTLD_COMMUNICATIONS_* and the
#: socket timeouts); their texts also match :data:`slurm.parse.UNREACHABLE`.
UNREACHABLE_ERRNOS = frozenset({1800, 1801, 1802, 1803, 1804, 5004, 5005})
#: What 22.05 answers both for an unreachable slurmctld and for a token slurmctld rejects.
UNSPECIFIED_ERRNO = -1
# Status codes a proxy in front of slurmrestd answers while it (re)starts.
_GATEWAY_STATUSES = frozenset({502, 503, 504})
_VERSION_RE = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")


@dataclass(frozen=True)
class RestError:
    """One entry of a reply's ``errors``: Slurm's error number (None when absent) and text."""

    number: int | None
    text: str

    def __str__(self) -> str:
        return self.text if self.number is None else f"{self.text} (errno {self.number})"


def load_reply(text: str) -> dict[str, Any] | None:
    """The reply as a JSON object, or None when it is not one (401 and 404 are plain text)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def reply_errors(doc: dict[str, Any] | None) -> list[RestError]:
    """The entries of ``doc["errors"]``, normalised; [] when there are none."""
    found = []
    for e in (doc or {}).get("errors") or []:
        if not isinstance(e, dict) or not e:
            continue
        number = next(
            (e[k] for k in ("error_number", "error_code", "errno") if isinstance(e.get(k), int)),
            None,
        )
        parts = [str(e[k]) for k in ("error", "description") if e.get(k)]
        found.append(RestError(number, ": ".join(parts) or "(no text)"))
    return found


def classify(
    what: str, status: int, text: str, *, token_expired: bool = False, version: str = API_VERSION
) -> SlurmError | SlurmUnavailableError | None:
    """The error a reply with HTTP ``status`` and body ``text`` stands for, or None when it is
    a plain success. ``what`` names the request in messages (e.g. ``GET nodes``);
    ``token_expired`` says whether the JWT sent has expired (see :func:`token_expiry`);
    ``version`` is the OpenAPI version spoken (named in a 404's message). Pure.

    Unreachable slurmctld, a 502/503/504 from a proxy -> SlurmUnavailableError (transient);
    401 -> SlurmRefusedError naming the credentials; 400 -> SlurmRefusedError (malformed);
    404 -> SlurmUnsupportedError (the caller adds what the daemon does offer); any other
    error -> SlurmRefusedError (a verdict).
    """
    doc = load_reply(text)
    errors = reply_errors(doc)
    if 200 <= status < 300 and not errors:
        return None
    if status == 401:
        return SlurmRefusedError(
            f"{what}: slurmrestd refused the credentials (HTTP 401: {text.strip()[:200]}); "
            "it needs X-SLURM-USER-NAME and a valid X-SLURM-USER-TOKEN (`scontrol token`)"
        )
    if status == 404:
        return SlurmUnsupportedError(
            f"{what}: slurmrestd does not serve this path (HTTP 404); this backend speaks "
            f"OpenAPI {version} ({SLURM_OF.get(version, 'Slurm')})"
        )
    if doc is None:
        cls = SlurmUnavailableError if status in _GATEWAY_STATUSES else SlurmRefusedError
        return cls(f"{what}: HTTP {status} without a JSON reply: {text.strip()[:200]!r}")
    detail = "; ".join(str(e) for e in errors) or f"HTTP {status}"
    if status == 400:
        # slurmrestd could not parse the request; its entries may still say errno -1.
        return SlurmRefusedError(f"{what}: refused as malformed (HTTP 400): {detail}")
    if any(e.number in UNREACHABLE_ERRNOS or UNREACHABLE.search(e.text) for e in errors):
        return SlurmUnavailableError(f"{what}: slurmctld unreachable: {detail}", delay=1.0)
    if any(e.number == UNSPECIFIED_ERRNO for e in errors):
        if token_expired:
            return SlurmRefusedError(
                f"{what}: refused: {detail}; the JWT has expired: make a new one "
                "(`scontrol token lifespan=SECONDS`)"
            )
        return SlurmUnavailableError(
            f"{what}: slurmctld unreachable, or it rejected the JWT (slurmrestd 22.05 "
            f"answers both with errno -1): {detail}",
            delay=1.0,
        )
    return SlurmRefusedError(f"{what}: refused: {detail}")


def submitted_job_id(text: str) -> int | None:
    """The ``job_id`` of a submission reply, or None when there is none (then it failed)."""
    doc = load_reply(text)
    value = (doc or {}).get("job_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def offered_versions(text: str) -> list[str]:
    """The OpenAPI plugin versions (``v0.0.38``, ...) whose paths an ``/openapi/v3`` document
    lists, sorted; [] when the text is not such a document."""
    doc = load_reply(text)
    paths = (doc or {}).get("paths")
    if not isinstance(paths, dict):
        return []
    found = {m.group(1) for p in paths if (m := _VERSION_RE.match(p))}
    return sorted(found, key=lambda v: tuple(int(x) for x in v[1:].split(".")))


def has_operation(text: str, path: str, method: str) -> bool:
    """Whether an ``/openapi/v3`` document offers ``method`` (lower case) on ``path``."""
    doc = load_reply(text)
    ops = ((doc or {}).get("paths") or {}).get(path)
    return isinstance(ops, dict) and method in ops


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim (Unix seconds) of a JWT, read without checking its signature (only
    slurmctld can); None when the token has no readable ``exp``."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        return None
    body = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(body))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
