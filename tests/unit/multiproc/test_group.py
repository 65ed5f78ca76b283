"""The group of a multi-process job over real loopback sockets, its members as threads of this
process: join, collectives, a clean end, and every way a member can be lost."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from recovery.errors import GroupError, PeerLostError
from recovery.multiproc import Group, free_port, join, wire
from recovery.multiproc.hub import Hub
from tests.unit.multiproc.helpers import Losses, form_group, on_all, topo


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def form() -> Iterator[Callable[..., tuple[list[Group], Losses]]]:
    made: list[Group] = []

    def make(size: int, **kw: Any) -> tuple[list[Group], Losses]:
        groups, losses = form_group(size, **kw)
        made.extend(groups)
        return groups, losses

    yield make
    for g in made:
        g.abort("test over")


def test_allgather_gives_every_value_in_rank_order(form: Any) -> None:
    groups, losses = form(3)
    assert {g.session for g in groups} == {groups[0].session}
    results = on_all(groups, lambda g: g.allgather({"rank": g.rank, "sq": g.rank**2}))
    assert results == [[{"rank": r, "sq": r * r} for r in range(3)]] * 3
    assert on_all(groups, lambda g: g.any(g.rank == 2)) == [True] * 3
    assert on_all(groups, lambda g: g.any(False)) == [False] * 3
    assert not losses


def test_channels_are_independent_of_each_other(form: Any) -> None:
    """A save thread's collectives never mix with the training loop's, whatever the order."""
    groups, _ = form(2)

    def member(g: Group) -> tuple[list[Any], list[Any]]:
        # Rank 0 calls "save" first, rank 1 calls "loop" first: per channel the order agrees.
        first, second = ("save", "loop") if g.rank == 0 else ("loop", "save")
        a = g.start_allgather(f"{first}-{g.rank}", channel=first)
        b = g.start_allgather(f"{second}-{g.rank}", channel=second)
        got = {first: a.result(5), second: b.result(5)}
        return got["save"], got["loop"]

    assert on_all(groups, member) == [(["save-0", "save-1"], ["loop-0", "loop-1"])] * 2


def test_a_clean_leave_is_not_a_loss(form: Any) -> None:
    groups, losses = form(3)
    on_all(groups, lambda g: g.barrier())
    on_all(groups, lambda g: g.leave(5))
    assert not losses


@pytest.mark.parametrize("victim", [0, 2])
def test_a_member_whose_connection_closes_is_lost_at_once(form: Any, victim: int) -> None:
    """What a killed process looks like to the others: its socket closes, no bye. Process 0
    going also takes the hub with it."""
    groups, losses = form(3)
    dead = groups[victim]
    dead._on_lost = None  # the dead one hears nothing
    dead._sock.close()
    if dead._hub is not None:
        dead._hub.close()
    others = [g.rank for g in groups if g.rank != victim]
    _wait(lambda: set(losses) >= set(others), "every other member to hear of the loss")
    assert {losses[r].rank for r in others} == {victim}
    assert all("died or was killed" in losses[r].reason for r in others)
    assert all(losses[r].status is None for r in others)
    with pytest.raises(PeerLostError, match=f"process {victim} was lost"):
        groups[others[0]].allgather(1)


def test_a_collective_waiting_on_a_lost_member_ends(form: Any) -> None:
    groups, losses = form(2)
    errors: list[PeerLostError] = []

    def waiter() -> None:
        try:
            groups[0].allgather("waiting")
        except PeerLostError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)  # in the collective, which member 1 never joins
    groups[1]._on_lost = None
    groups[1]._sock.close()
    t.join(10)
    assert not t.is_alive()
    assert len(errors) == 1
    assert errors[0].rank == 1
    assert losses[0].rank == 1


def test_an_abort_carries_the_reason_and_status(form: Any) -> None:
    groups, losses = form(3)
    groups[1].abort("RunLockedError: in use", status=3)
    _wait(lambda: {0, 2} <= set(losses), "the abort to reach everyone")
    assert losses[0].rank == losses[2].rank == 1
    assert losses[0].status == 3
    assert "RunLockedError: in use" in losses[0].reason
    assert 1 not in losses


def test_process_0s_abort_reaches_the_others_before_its_hub_closes(
    form: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process 0 hosts the hub: its abort must be read and passed on before the hub goes, or
    the others see only a closed connection (no reason, no status). Here the hub thread is
    held between two turns of its loop (in its heartbeat) while process 0 aborts, as a loaded
    machine holds it: closing the hub at once would end the loop before it reads the abort."""
    held, holding = threading.Event(), threading.Event()
    heartbeat = Hub._heartbeat

    def slow_heartbeat(hub: Hub, now: float) -> None:
        if held.is_set():
            holding.set()
            time.sleep(0.3)
            held.clear()
        heartbeat(hub, now)

    monkeypatch.setattr(Hub, "_heartbeat", slow_heartbeat)
    groups, losses = form(2)
    held.set()
    _wait(holding.is_set, "the hub thread to be held")
    groups[0].abort("RunLockedError: in use", status=3)
    _wait(lambda: 1 in losses, "process 1 to hear of the loss")
    assert losses[1].rank == 0
    assert losses[1].status == 3, losses[1]
    assert "RunLockedError: in use" in losses[1].reason


def test_a_member_that_falls_silent_is_lost_after_the_silence(form: Any) -> None:
    """A node that vanished without closing anything (power loss): no more heartbeats."""
    port = free_port()
    losses: Losses = {}
    result: list[Group] = []

    def rank0() -> None:
        result.append(
            join(
                topo(0, 2, port),
                on_lost=lambda lost: losses.update({0: lost}),
                heartbeat_s=0.05,
                silence_s=0.5,
            )
        )

    t = threading.Thread(target=rank0)
    t.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    wire.send(raw, {"op": "hello", "rank": 1, "size": 2, "group": "job"})
    t.join(10)
    try:
        _wait(lambda: 0 in losses, "the silent member to be declared lost")
        assert losses[0].rank == 1
        assert "nothing heard from it" in losses[0].reason
    finally:
        raw.close()
        result[0].abort("done")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        ({"rank": 1, "size": 2, "group": "other-job"}, "is not this job's"),
        ({"rank": 5, "size": 2, "group": "job"}, "does not fit a job of 2"),
        ({"rank": 1, "size": 3, "group": "job"}, "does not fit a job of 2"),
    ],
)
def test_a_stray_process_is_refused(hello: dict[str, Any], reason: str) -> None:
    port = free_port()
    with ThreadPoolExecutor(1) as pool:
        rank0 = pool.submit(join, topo(0, 2, port), join_timeout_s=3)
        time.sleep(0.2)
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        wire.send(raw, {"op": "hello", **hello})
        framer = wire.Framer()
        raw.settimeout(5)
        (answer,) = framer.feed(raw.recv(65536))
        raw.close()
        assert answer["op"] == "refused"
        assert reason in answer["reason"]
        with pytest.raises(GroupError, match="process\\(es\\) 1 of 2 did not join within 3 s"):
            rank0.result(10)


@pytest.mark.slow
def test_a_second_process_with_the_same_rank_is_refused() -> None:
    port = free_port()
    with ThreadPoolExecutor(3) as pool:
        first = [pool.submit(join, topo(r, 3, port), join_timeout_s=5) for r in (0, 1)]
        time.sleep(0.3)
        with pytest.raises(GroupError, match="rank 1 has joined already"):
            join(topo(1, 3, port), join_timeout_s=5)
        for f in first:
            with pytest.raises(GroupError, match="2 of 3 did not join"):
                f.result(10)


def test_a_process_that_cannot_reach_process_0_says_where_it_looked() -> None:
    port = free_port()
    with pytest.raises(GroupError, match=f"cannot reach process 0 at 127.0.0.1:{port}"):
        join(topo(1, 2, port), join_timeout_s=0.3)


def test_process_0_cannot_listen_on_a_port_in_use() -> None:
    with socket.create_server(("", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(GroupError, match=f"cannot listen on port {port}"):
            join(topo(0, 2, port), join_timeout_s=1)


def _hello(port: int, rank: int, size: int) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    wire.send(raw, {"op": "hello", "rank": rank, "size": size, "group": "job"})
    return raw


def test_a_process_lost_during_the_join_stops_the_late_ones_too() -> None:
    """A member dies after its hello, before everyone arrived: one arriving later is told at
    once instead of waiting out the join timeout."""
    hub = Hub(
        size=3, group_id="job", port=0, join_timeout_s=30, heartbeat_s=0.1, silence_s=30
    ).start()
    try:
        early = _hello(hub.port, 0, 3)
        doomed = _hello(hub.port, 1, 3)
        time.sleep(0.2)
        doomed.close()  # member 1 dies
        late = _hello(hub.port, 2, 3)
        for raw in (early, late):
            framer, got = wire.Framer(), list[wire.Message]()
            while not any(m["op"] == "lost" for m in got):
                got += framer.feed(raw.recv(65536))
            (lost,) = [m for m in got if m["op"] == "lost"]
            assert lost["rank"] == 1
            assert "died or was killed" in lost["reason"]
            raw.close()
    finally:
        hub.close()


def test_without_reacting_a_loss_is_ignored_and_collectives_wait(form: Any) -> None:
    """Measurement mode: the others block as they would without the watch."""
    groups, losses = form(2, react=False)
    groups[1]._sock.close()
    with pytest.raises(GroupError, match=r"no answer to main #1 within 0\.5 s"):
        groups[0].allgather(1, timeout_s=0.5)
    assert not losses
    assert groups[0].lost is None
