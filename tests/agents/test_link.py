"""The agent's token file, its settings from the command line, and how answers are sorted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.cli import agent_config
from agents.link import CoordinatorLink, Refused, read_agent_token
from recovery.coordinator.replica import Role
from recovery.errors import CoordinatorUnavailableError, UsageError
from recovery.ports.clock import SystemClock
from service.httpapi.app import create_app
from service.httpapi.server import ServerThread, free_port
from service.journaldb.journal import SqliteJournal
from tests.agents.live import LiveCoordinator
from tests.service.helpers import NODE_TOKENS, FakeCoordinator, event, tokens

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


def test_a_list_of_replicas_goes_past_a_dead_one_and_a_standby_to_the_leader(
    live: LiveCoordinator, tmp_path: Path
) -> None:
    """``--coordinator dead,standby,leader``: the heartbeat (which only the leader takes)
    and the events land on the leader, and the link keeps to it afterwards."""
    clock = SystemClock()
    journal = SqliteJournal(tmp_path / "standby.db", clock)
    standby: Any = create_app(journal=journal, tokens=tokens(), coordinator=FakeCoordinator(),
                              clock=clock, role=lambda: Role("standby", "b", "a", 1))  # fmt: skip
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        with ServerThread(standby) as server:
            link = CoordinatorLink(
                f"{dead},{server.url},{live.url}", NODE_TOKENS["n1"], "n1", timeout_s=5
            )
            link.heartbeat("0")
            assert link.url == live.url
            delivered = link.post_events([event(1, node="n1")])
            assert delivered.accepted == ("ev-1",)
            assert [s.event.id for s in live.journal.undecided()] == ["ev-1"]
            assert journal.undecided() == []  # nothing went to the standby
            link.close()
            # All refusing: the caller sees why, replica by replica.
            only = CoordinatorLink(f"{dead},{server.url}", NODE_TOKENS["n1"], "n1", timeout_s=5)
            with pytest.raises(CoordinatorUnavailableError) as e:
                only.heartbeat("0")
            assert "does not answer" in str(e.value)
            assert "replica b stands by (a leads)" in str(e.value)
            only.close()
    finally:
        journal.close()
