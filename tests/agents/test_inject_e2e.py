"""``recover inject`` end to end: the CLI's function -> POST /v1/inject -> the command broker ->
a real agent process -> its pipeline or its kernel log -> the intake -> the journal and the
(fake) engine's submit. And every refusal, with nothing recorded."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx
import pytest
import typer
from typer.testing import CliRunner

from recover.inject import register, render
from recovery.errors import AuthError, UsageError
from recovery.model import Source
from recovery.ports.journal import ActionStatus
from service.httpapi.client import Client, inject
from tests.agents.helpers import wait_for
from tests.agents.live import AgentProcess, LiveCoordinator, wait_connected
from tests.service.helpers import replace_decision

Start = Callable[..., AgentProcess]


def admin(live: LiveCoordinator) -> Client:
    return Client.locate(live.url, live.tokens_file, None)


def test_injected_xid79_via_the_agent_pipeline_reaches_journal_and_engine(
    live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n1")
    wait_connected(live, "n1", agent)
    reply = inject(admin(live), fault="xid79", node="n1", gpu=3)
    eid = reply["event_id"]
    assert eid.startswith("n1:injected:")
    wait_for(lambda: eid in live.stored_ids(), f"{eid} in the journal")
    (event,) = [e for e in live.stored() if e.id == eid]
    assert (event.fault, event.accelerator, event.injected, event.source) == (
        "xid79", 3, True, Source.injected
    )  # fmt: skip
    wait_for(lambda: eid in live.coordinator.submitted_ids(), "the engine to be handed it")
    assert live.stored_ids().count(eid) == 1


def test_injected_xid79_via_the_kernel_log_is_found_by_the_agents_own_parser(
    live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n2", "--simulated-gpus", "8")
    wait_connected(live, "n2", agent)
    reply = inject(admin(live), fault="xid79", node="n2", gpu=5, via="kmsg")
    eid, line = reply["event_id"], reply["line"]
    assert eid.startswith("n2:kmsg:")
    assert "NVRM: Xid (PCI:0000:05:00): 79" in line
    assert line in agent.kmsg.read_text()
    wait_for(lambda: eid in live.stored_ids(), f"{eid} in the journal")
    (event,) = [e for e in live.stored() if e.id == eid]
    assert (event.fault, event.accelerator, event.injected, event.source) == (
        "xid79", 5, False, Source.kmsg
    )  # fmt: skip
    assert f"[recover-inject {reply['command']}]" in event.message
    wait_for(lambda: eid in live.coordinator.submitted_ids(), "the engine to be handed it")


@pytest.mark.slow
def test_wait_prints_the_decision_once_the_engine_records_it(
    live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n1")
    wait_connected(live, "n1", agent)
    stop = threading.Event()

    def engine() -> None:  # a stand-in engine: decides what arrives, then "applies" it
        while not stop.is_set():
            for stored in live.journal.undecided():
                planned = live.journal.record_decision(
                    replace_decision(stored.event, f"inc-{stored.seq}"), stored.received
                )
                stop.wait(0.3)  # --wait must wait for the actions too, not the decision alone
                for a in planned:
                    live.journal.record_outcome(a.id, ActionStatus.done, stored.received)
                applied.set()
            stop.wait(0.02)

    applied = threading.Event()
    thread = threading.Thread(target=engine, daemon=True)
    thread.start()
    try:
        reply = inject(admin(live), fault="xid79", node="n1", wait=True, wait_timeout_s=20)
    finally:
        stop.set()
        thread.join()
    assert applied.is_set()  # returned only once the actions were recorded applied
    assert reply["decision"]["event_id"] == reply["event_id"]
    assert reply["decision"]["verdict"] == "replace"
    text = render(reply)
    assert "decision: replace;" in text
    assert reply["event_id"] in text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "node", "via", "message"),
    [
        ("xid99", "n1", "agent", "Unknown fault 'xid99'. Known: "),
        ("xid79", "n9", "agent", "Unknown node 'n9'. Known: n1, n2, n3"),
        ("xid79", "n3", "agent", "the agent for node n3 has not polled in the last 10 s"),
        ("ecc-uncorrected", "n1", "kmsg", "writes XID lines only"),
    ],
)
def test_refused_injections_record_nothing(
    live: LiveCoordinator, agents: Start, fault: str, node: str, via: str, message: str
) -> None:
    agent = agents("n1")
    wait_connected(live, "n1", agent)
    with pytest.raises(UsageError) as e:
        inject(admin(live), fault=fault, node=node, via=via)
    assert message in str(e.value)
    assert live.stored_ids() == []
    assert live.channel is not None
    assert live.channel.broker.pending(node) == 0


def test_inject_needs_the_admin_token(live: LiveCoordinator) -> None:
    with pytest.raises(AuthError, match="403"):
        inject(Client(live.url, live.node_tokens["n1"]), fault="xid79", node="n1")
    with pytest.raises(AuthError, match="401"):
        inject(Client(live.url, "x" * 20), fault="xid79", node="n1")
    assert live.stored_ids() == []


@pytest.mark.parametrize(
    ("token_of", "path", "status"),
    [
        ("n2", "/v1/agents/n1/commands?wait=0", 403),
        ("admin", "/v1/agents/n1/commands?wait=0", 403),
        (None, "/v1/agents/n1/commands?wait=0", 401),
        ("n1", "/v1/agents/n1/commands?wait=0", 200),
    ],
)
def test_only_a_nodes_own_token_polls_its_commands(
    live: LiveCoordinator, token_of: str | None, path: str, status: int
) -> None:
    token = {"admin": live.admin_token, **live.node_tokens}.get(token_of or "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(live.url + path, headers=headers)
    assert r.status_code == status, r.text
    assert live.channel is not None
    assert live.channel.broker.connected("n1") == (status == 200)


def test_the_typer_command_prints_the_event_id(live: LiveCoordinator, agents: Start) -> None:
    agent = agents("n1")
    wait_connected(live, "n1", agent)
    app = typer.Typer()
    register(app)
    args = ["--fault", "xid79", "--node", "n1", "--coordinator", live.url]
    result = CliRunner().invoke(app, [*args, "--token-file", str(live.tokens_file), "--json"])
    assert result.exit_code == 0, result.output
    eid = json.loads(result.output)["event_id"]
    wait_for(lambda: eid in live.stored_ids(), f"{eid} in the journal")
