"""The tokens file: format, errors naming the line, generation, constant-time lookup."""

from __future__ import annotations

import hmac
import stat
from pathlib import Path

import pytest

from recovery.errors import UsageError
from service.httpapi import auth
from service.httpapi.auth import ADMIN, Principal, generate_tokens, load_tokens

GOOD = """\
# coordinator tokens
admin AAAAAAAAAAAAAAAAAAAA

node n1 BBBBBBBBBBBBBBBBBBBB
  node n2   CCCCCCCCCCCCCCCCCCCC
"""


def test_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(GOOD)
    table = load_tokens(path)
    assert table.lookup("AAAAAAAAAAAAAAAAAAAA") == ADMIN
    assert table.lookup("BBBBBBBBBBBBBBBBBBBB") == Principal("n1")
    assert table.lookup("CCCCCCCCCCCCCCCCCCCC") == Principal("n2")
    assert table.lookup("DDDDDDDDDDDDDDDDDDDD") is None
    assert table.lookup("") is None
    assert table.lookup(None) is None
    assert table.nodes() == ["n1", "n2"]


def test_principals() -> None:
    assert ADMIN.admin
    assert ADMIN.may_report_for("n7")
    assert not Principal("n1").admin
    assert Principal("n1").may_report_for("n1")
    assert not Principal("n1").may_report_for("n2")


TOKEN_A, TOKEN_B = "a" * 20, "b" * 20


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"admin {TOKEN_A}\nadmin {TOKEN_B}\n", r":2: a second 'admin' line"),
        (f"admin {TOKEN_A}\nnode n1\n", r":2: expected 'admin <token>' or 'node <name> <token>'"),
        (f"admin {TOKEN_A}\nagent n1 {TOKEN_B}\n", r":2: expected .*got 'agent'"),
        ("admin short\n", r":1: a token is 16-256 characters"),
        (f"admin {TOKEN_A}\nnode n1 {'x' * 19}!\n", r":2: a token is 16-256 characters"),
        (f"admin {TOKEN_A}\nnode 1bad {TOKEN_B}\n", r":2: invalid node name '1bad'"),
        (f"admin {TOKEN_A}\nnode n1 {TOKEN_B}\nnode n1 {'c' * 20}\n", r":3: node 'n1' already"),
        (f"admin {TOKEN_A}\nnode n1 {TOKEN_A}\n", r":2: this token already appears"),
        (f"# only a comment\nnode n1 {TOKEN_B}\n", r"no 'admin <token>' line"),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_tokens(path)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read tokens file"):
        load_tokens(tmp_path / "absent")


def test_generate_writes_a_private_file_that_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("old content")
    table = generate_tokens(path, ["n2", "n1"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"], "no temporary left"
    loaded = load_tokens(path)
    assert loaded.admin_token == table.admin_token
    assert loaded.node_tokens == table.node_tokens
    assert loaded.nodes() == ["n1", "n2"]
    assert len({table.admin_token, *table.node_tokens.values()}) == 3
    assert generate_tokens(path, ["n1"]).admin_token != table.admin_token


@pytest.mark.parametrize(("nodes", "message"), [(["n1", "n1"], "repeat"), (["-x"], "invalid")])
def test_generate_refuses_bad_names(tmp_path: Path, nodes: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        generate_tokens(tmp_path / "tokens", nodes)
    assert not (tmp_path / "tokens").exists()


@pytest.mark.parametrize("presented", [TOKEN_A, "c" * 20, "", "d" * 200])
def test_lookup_compares_every_token_whatever_matches(
    monkeypatch: pytest.MonkeyPatch, presented: str
) -> None:
    table = auth.TokenTable(TOKEN_A, {f"n{i}": f"{i:02d}" * 10 for i in range(5)})
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    table.lookup(presented)
    assert len(calls) == 6, "no early exit: the admin and all five node tokens are compared"
