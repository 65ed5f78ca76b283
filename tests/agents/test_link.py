"""The agent's token file, its settings from the command line, and how answers are sorted."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.cli import agent_config
from agents.link import CoordinatorLink, Refused, read_agent_token
from recovery.errors import CoordinatorUnavailableError, UsageError
from service.httpapi.server import free_port
from tests.agents.live import LiveCoordinator

TOKENS = "# tokens\nadmin " + "a" * 20 + "\nnode n1 " + "1" * 20 + "\nnode n2 " + "2" * 20 + "\n"


@pytest.mark.parametrize(
    ("text", "node", "token"),
    [
        (TOKENS, "n2", "2" * 20),
        ("# this node's secret\n" + "s" * 30 + "\n", "anything", "s" * 30),
    ],
)
def test_token_from_the_tokens_file_or_a_file_of_just_the_token(
    tmp_path: Path, text: str, node: str, token: str
) -> None:
    (tmp_path / "t").write_text(text)
    assert read_agent_token(tmp_path / "t", node) == token


def test_a_tokens_file_without_the_node_names_the_nodes_it_has(tmp_path: Path) -> None:
    (tmp_path / "t").write_text(TOKENS)
    with pytest.raises(UsageError, match=r"no 'node n9 TOKEN' line \(nodes in it: n1, n2\)"):
        read_agent_token(tmp_path / "t", "n9")
    with pytest.raises(UsageError, match="cannot read token file"):
        read_agent_token(tmp_path / "missing", "n1")


def test_unknown_source_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "t").write_text(TOKENS)
    known = r"Unknown source 'gpu'\. Known: inject, journald, kmsg, nvml, progress, tpu"
    with pytest.raises(UsageError, match=known):
        agent_config(
            node="n1", coordinator="http://x", token_file=tmp_path / "t", sources="kmsg,gpu",
            spool=None, kmsg_file=tmp_path / "k",
        )  # fmt: skip


def test_transport_failure_is_transient_and_a_refusal_is_a_verdict(
    live: LiveCoordinator,
) -> None:
    down = CoordinatorLink(f"http://127.0.0.1:{free_port()}", "x" * 20, "n1", timeout_s=2)
    with pytest.raises(CoordinatorUnavailableError, match="does not answer"):
        down.heartbeat("0")
    wrong = CoordinatorLink(live.url, "x" * 20, "n1", timeout_s=5)
    with pytest.raises(Refused) as e:
        wrong.heartbeat("0")
    assert e.value.status == 401
    for link in (down, wrong):
        link.close()
