"""Who may call the coordinator's HTTP API: the tokens file.

Format: UTF-8 text, one entry per line; blank lines and lines starting with ``#`` are ignored::

    # recover coordinator tokens
    admin <token>
    node <node-name> <token>

* exactly one ``admin`` line: that token may call everything, including the operator verbs
  (``POST /v1/nodes/{node}/repaired``, ``POST /v1/breaker/reset``), and report events for any
  node;
* one ``node`` line per agent: that token may read and report events for its own node only;
* a token is 16 to 256 characters of ``A-Z a-z 0-9 _ -`` (what ``secrets.token_urlsafe``
  writes), and no token appears twice; node names follow the event schema's pattern.

A lookup compares the presented token with every entry (constant time), so it costs about
0.07-0.14 us per entry: ~5 us with 64 nodes, ~70 us with 1,000, ~1.4 ms with 10,000 (measured).

Keep the file private (mode 0600; :func:`generate_tokens` writes it so). Clients send the token
as ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recovery.errors import UsageError
from recovery.fsutil import fsync_dir
from recovery.model.events import NODE_PATTERN

TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{16,256}$")
_NODE_RE = re.compile(NODE_PATTERN)
TOKEN_BYTES = 32
"""Random bytes per generated token (43 characters of URL-safe base64)."""


@dataclass(frozen=True)
class Principal:
    """Who a token belongs to: the admin (``node`` is None) or the agent of ``node``."""

    node: str | None

    @property
    def admin(self) -> bool:
        return self.node is None

    def may_report_for(self, node: str) -> bool:
        """Whether this caller may post events about ``node``."""
        return self.node is None or self.node == node


ADMIN = Principal(None)


class TokenTable:
    """Tokens and whom they belong to. Lookups compare against every token in constant time."""

    def __init__(self, admin: str, nodes: dict[str, str]) -> None:
        """``admin`` is the admin token, ``nodes`` maps node name -> token."""
        self._entries: tuple[tuple[bytes, Principal], ...] = (
            (admin.encode(), ADMIN),
            *((token.encode(), Principal(node)) for node, token in sorted(nodes.items())),
        )
        self.admin_token = admin
        self.node_tokens = dict(nodes)

    def lookup(self, token: str | None) -> Principal | None:
        """The principal ``token`` belongs to, or None. Every stored token is compared with
        :func:`hmac.compare_digest` and the loop never stops early, so the time taken does not
        tell which entry (if any) matched, nor how much of a token was right."""
        presented = (token or "").encode()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, presented):
                found = principal
        return found

    def nodes(self) -> list[str]:
        """The nodes that have an agent token."""
        return sorted(self.node_tokens)


def _bad(path: Path, lineno: int, why: str) -> UsageError:
    return UsageError(f"{path}:{lineno}: {why}")


def _check_token(path: Path, lineno: int, token: str, seen: set[str]) -> None:
    if not TOKEN_RE.match(token):
        raise _bad(path, lineno, "a token is 16-256 characters of A-Z a-z 0-9 _ -")
    if token in seen:
        raise _bad(path, lineno, "this token already appears on an earlier line")
    seen.add(token)


def parse_tokens(text: str, path: Path) -> TokenTable:
    """Parse the tokens file's ``text`` (``path`` is only used in messages). Raises UsageError
    naming the line for anything that is not ``admin <token>`` or ``node <name> <token>``."""
    admin: str | None = None
    nodes: dict[str, str] = {}
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "admin" and len(words) == 2:
            if admin is not None:
                raise _bad(path, lineno, "a second 'admin' line; there is exactly one")
            _check_token(path, lineno, words[1], seen)
            admin = words[1]
        elif words[0] == "node" and len(words) == 3:
            name, token = words[1], words[2]
            if not _NODE_RE.match(name):
                raise _bad(path, lineno, f"invalid node name {name!r}")
            if name in nodes:
                raise _bad(path, lineno, f"node {name!r} already has a token")
            _check_token(path, lineno, token, seen)
            nodes[name] = token
        else:
            raise _bad(
                path,
                lineno,
                f"expected 'admin <token>' or 'node <name> <token>', got {words[0]!r} "
                f"with {len(words) - 1} field(s)",
            )
    if admin is None:
        raise UsageError(f"{path}: no 'admin <token>' line")
    return TokenTable(admin, nodes)


def load_tokens(path: Path) -> TokenTable:
    """Read the tokens file at ``path``. Raises UsageError when it cannot be read or a line is
    malformed (the message names the line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read tokens file {path}: {e}") from e
    return parse_tokens(text, Path(path))


def format_tokens(table: TokenTable) -> str:
    """The tokens file's text for ``table``."""
    lines = ["# recover coordinator tokens: admin <token> / node <name> <token>"]
    lines.append(f"admin {table.admin_token}")
    lines.extend(f"node {n} {table.node_tokens[n]}" for n in table.nodes())
    return "\n".join(lines) + "\n"


def generate_tokens(path: Path, nodes: Iterable[str]) -> TokenTable:
    """Make a fresh admin token and one token per node (``secrets.token_urlsafe``) and write
    them to ``path`` atomically (a private temporary file, fsynced, renamed over ``path``, the
    directory fsynced), mode 0600. Raises UsageError for an invalid or repeated node name, or
    when the file cannot be written."""
    names = list(nodes)
    for name in names:
        if not _NODE_RE.match(name):
            raise UsageError(f"invalid node name {name!r} (letters, digits, _ . -)")
    if len(set(names)) != len(names):
        raise UsageError("node names repeat: " + ", ".join(sorted(names)))
    table = TokenTable(
        secrets.token_urlsafe(TOKEN_BYTES), {n: secrets.token_urlsafe(TOKEN_BYTES) for n in names}
    )
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(format_tokens(table).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write tokens file {path}: {e}") from e
    return table
