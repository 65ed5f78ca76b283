"""The agent-facing pieces of the service: the heartbeat tracker and the command broker (fake
clocks, no server), and the heartbeat/decision routes over a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.ports.clock import FakeClock
from service.httpapi.agents_api import HeartbeatTracker
from service.httpapi.commands import CommandBroker
from tests.service.helpers import (
    NODE_TOKENS,
    auth,
    event,
    event_json,
    replace_decision,
    running_api,
)

# --- heartbeat tracker ----------------------------------------------------------------------


def test_tracker_reports_nodes_silent_for_longer_than_asked() -> None:
    clock = FakeClock()
    hb = HeartbeatTracker(clock)
    assert hb.last_seen("n1") is None
    hb.beat("n1", "0.1.0")
    clock.advance(4)
    hb.beat("n2", "0.2.0")
    now = clock.advance(3).mono
    assert hb.silent(now, after_s=5) == ["n1"]  # 7 s silent; n2 only 3 s
    assert hb.silent(now, after_s=2) == ["n1", "n2"]
    assert hb.silent(now, after_s=10) == []
    assert hb.last_seen("n2") == now - 3
    assert hb.version("n2") == "0.2.0"


def test_a_beat_clears_silence_and_forget_drops_the_node() -> None:
    clock = FakeClock()
    hb = HeartbeatTracker(clock)
    hb.beat("n1")
    clock.advance(60)
    assert hb.silent(clock.now().mono, 5) == ["n1"]
    hb.beat("n1")
    assert hb.silent(clock.now().mono, 5) == []
    clock.advance(60)
    hb.forget("n1")
    assert hb.silent(clock.now().mono, 5) == []


# --- command broker -------------------------------------------------------------------------


def test_a_queued_command_is_handed_out_at_once_and_acknowledged() -> None:
    async def scenario() -> None:
        broker = CommandBroker(FakeClock())
        cmd = broker.enqueue("n1", "inject", {"fault": "xid79"})
        (got,) = await broker.wait("n1", 30)
        assert got.to_json() == {
            "id": cmd.id, "node": "n1", "kind": "inject", "args": {"fault": "xid79"}
        }  # fmt: skip
        assert broker.ack("n1", cmd.id, {"event_id": "e1"})
        assert await broker.wait_ack(cmd, 1) == {"event_id": "e1"}
        assert not broker.ack("n1", cmd.id, {})  # already acknowledged
        assert broker.pending("n1") == 0

    asyncio.run(scenario())


def test_a_held_poll_wakes_when_a_command_arrives() -> None:
    async def scenario() -> None:
        broker = CommandBroker(FakeClock())
        poll = asyncio.create_task(broker.wait("n1", 30))
        await asyncio.sleep(0)  # let the poll start waiting
        assert broker.connected("n1")
        cmd = broker.enqueue("n1", "inject", {})
        got = await asyncio.wait_for(poll, 5)
        assert [c.id for c in got] == [cmd.id]

    asyncio.run(scenario())


def test_an_unacknowledged_command_is_handed_out_again_after_its_lease() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        broker = CommandBroker(clock, lease_s=5)
        cmd = broker.enqueue("n1", "inject", {})
        assert len(await broker.wait("n1", 0)) == 1
        assert await broker.wait("n1", 0) == []  # delivered, lease running
        clock.advance(5)
        assert [c.id for c in await broker.wait("n1", 0)] == [cmd.id]

    asyncio.run(scenario())


def test_connected_means_polled_recently() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        broker = CommandBroker(clock, connected_within_s=10)
        assert not broker.connected("n1")
        await broker.wait("n1", 0)
        clock.advance(10)
        assert broker.connected("n1")
        clock.advance(0.5)
        assert not broker.connected("n1")

    asyncio.run(scenario())


def test_cancel_and_the_pending_limit() -> None:
    async def scenario() -> None:
        broker = CommandBroker(FakeClock(), max_pending=2)
        a = broker.enqueue("n1", "inject", {})
        broker.enqueue("n1", "inject", {})
        with pytest.raises(UsageError, match="already has 2 unacknowledged"):
            broker.enqueue("n1", "inject", {})
        assert broker.cancel(a.id)
        assert not broker.cancel(a.id)
        assert await broker.wait_ack(a, 0.01) is None
        broker.enqueue("n1", "inject", {})  # room again

    asyncio.run(scenario())


def test_close_ends_held_polls_at_once() -> None:
    async def scenario() -> None:
        broker = CommandBroker(FakeClock())
        poll = asyncio.create_task(broker.wait("n1", 60))
        await asyncio.sleep(0)
        broker.close()
        assert await asyncio.wait_for(poll, 5) == []

    asyncio.run(scenario())


# --- routes over a real server --------------------------------------------------------------


def test_heartbeat_route_records_in_memory_for_the_tokens_own_node(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        r = api.client.post(
            "/v1/heartbeat", json={"node": "n1", "version": "9"}, headers=auth(NODE_TOKENS["n1"])
        )
        assert r.status_code == 200, r.text
        first = r.json()
        r = api.client.post("/v1/heartbeat", json={"node": "n2"}, headers=auth(NODE_TOKENS["n1"]))
        assert r.status_code == 403
        r = api.client.post("/v1/heartbeat", json={"node": "n1"})
        assert r.status_code == 401
        assert first["progress"] == {}  # no site thresholds: the agents' own defaults
        api.app.state.agents.progress = {"floor_s": 30, "straggler": {"factor": 2.0}}
        beat = {"node": "n1", "version": "9"}
        r = api.client.post("/v1/heartbeat", json=beat, headers=auth(NODE_TOKENS["n1"]))
        assert r.json()["progress"] == {"floor_s": 30, "straggler": {"factor": 2.0}}
        tracker = api.app.state.agents.heartbeats
        assert tracker.version("n1") == "9"
        assert tracker.last_seen("n2") is None
        listed = {
            a["node"]: a
            for a in api.client.get("/v1/agents", headers=auth(NODE_TOKENS["n1"])).json()
        }
        assert listed["n1"]["version"] == "9"
        assert listed["n1"]["connected"] is False
        assert api.stored_ids() == []


def test_decision_route_says_stored_and_decided(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        h = auth(NODE_TOKENS["n1"])
        assert api.client.get("/v1/events/ev-1/decision", headers=h).json() == {
            "event_id": "ev-1", "stored": False, "decision": None
        }  # fmt: skip
        assert api.client.post("/v1/events", json=event_json(1), headers=h).status_code == 200
        doc = api.client.get("/v1/events/ev-1/decision", headers=h).json()
        assert doc["stored"] is True
        assert doc["decision"] is None
        (stored,) = api.journal.undecided()
        api.journal.record_decision(replace_decision(event(1), "inc-1"), stored.received)
        doc = api.client.get("/v1/events/ev-1/decision", headers=h).json()
        assert doc["decision"]["incident"] == "inc-1"
        assert api.client.get("/v1/events/ev-1/decision").status_code == 401
