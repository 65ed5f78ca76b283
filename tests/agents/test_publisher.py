"""The publisher: acknowledges only what the coordinator committed, retries transport failures
with backoff, keeps refused events aside; against a fake sink and against the real API."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents.link import CoordinatorLink, Delivery, Refused
from agents.publisher import DEFAULT_BACKOFF, EventSink, Publisher, RejectedStore
from agents.spool import Spool
from recovery.errors import CoordinatorUnavailableError, TransientError
from recovery.model import HealthEvent
from recovery.retry import Backoff
from tests.agents.helpers import make_event, wait_for
from tests.agents.live import LiveCoordinator

NODE = "n1"


@dataclass
class FakeSink:
    """Answers each request with the next scripted outcome: "ok", "dup", a status (Refused),
    or "down" (CoordinatorUnavailableError); "ok" once the script is used up."""

    script: list[object] = field(default_factory=list)
    bad: set[str] = field(default_factory=set)
    requests: list[list[str]] = field(default_factory=list)

    def post_events(self, events: Sequence[HealthEvent]) -> Delivery:
        ids = [e.id for e in events]
        self.requests.append(ids)
        step = self.script.pop(0) if self.script else "ok"
        if step == "down":
            raise CoordinatorUnavailableError("connection refused")
        if isinstance(step, int):
            raise Refused(step, f"refused with {step}", "deliver events")
        if self.bad & set(ids):
            raise Refused(422, "field 'fault' is invalid", "deliver events")
        return Delivery((), tuple(ids)) if step == "dup" else Delivery(tuple(ids), ())


def publisher(
    tmp_path: Path, sink: EventSink, n: int, *, batch: int = 200, backoff: Backoff = DEFAULT_BACKOFF
) -> Publisher:
    spool = Spool(tmp_path / "spool", log=lambda _: None)
    for i in range(n):
        spool.put(make_event(i, node=NODE))
    rejected = RejectedStore(tmp_path / "spool" / "rejected")
    return Publisher(spool, sink, rejected, batch=batch, backoff=backoff, log=lambda _: None)


@pytest.mark.parametrize("answer", ["ok", "dup"])
def test_accepted_and_duplicate_ids_alike_leave_the_spool(tmp_path: Path, answer: str) -> None:
    sink = FakeSink([answer] * 3)
    pub = publisher(tmp_path, sink, 5, batch=2)
    assert pub.send_pending() == 5
    assert len(pub.spool) == 0
    assert [len(r) for r in sink.requests] == [2, 2, 1]  # oldest first, in batches


def test_a_failed_send_keeps_everything_unacknowledged(tmp_path: Path) -> None:
    pub = publisher(tmp_path, FakeSink(["ok", "down"]), 5, batch=2)
    with pytest.raises(TransientError):
        pub.send_pending()
    assert [s.event.id for s in pub.spool.pending()] == [
        make_event(i, node=NODE).id for i in (2, 3, 4)
    ]


def test_an_answer_that_omits_an_id_keeps_that_event(tmp_path: Path) -> None:
    class Forgetful(FakeSink):
        def post_events(self, events: Sequence[HealthEvent]) -> Delivery:
            return Delivery(tuple(e.id for e in events[1:]), ())

    pub = publisher(tmp_path, Forgetful(), 3)
    with pytest.raises(TransientError, match="did not name 1 event"):
        pub.send_pending()
    assert [s.event.id for s in pub.spool.pending()] == [make_event(0, node=NODE).id]


def test_outage_is_retried_with_growing_waits_until_it_ends(tmp_path: Path) -> None:
    sink = FakeSink(["down"] * 4)
    pub = publisher(
        tmp_path, sink, 3, backoff=Backoff(attempts=100, initial_s=0.1, factor=2, max_s=0.5)
    )
    stop, wake, waits = threading.Event(), threading.Event(), []

    def fake_wait(seconds: float) -> bool:
        waits.append(seconds)
        return False

    def idle(_: float | None = None) -> bool:  # after the backlog is gone: stop the loop
        stop.set()
        return True

    wake.wait = idle  # type: ignore[method-assign,assignment]
    pub.run(stop, wake, wait=fake_wait)
    assert waits == [0.1, 0.2, 0.4, 0.5]
    assert len(pub.spool) == 0
    assert pub.stats.failures == 4


def test_a_refused_batch_is_split_and_only_the_bad_event_is_kept_aside(tmp_path: Path) -> None:
    bad = make_event(3, node=NODE).id
    sink = FakeSink(bad={bad})
    pub = publisher(tmp_path, sink, 8, batch=8)
    assert pub.send_pending() == 8
    assert len(pub.spool) == 0
    assert pub.rejected.ids() == [bad]
    (kept,) = (tmp_path / "spool" / "rejected").glob("*.json")
    doc = json.loads(kept.read_text())
    assert doc["status"] == 422
    assert "fault" in doc["reason"]
    assert doc["event"]["id"] == bad
    assert pub.stats.sent == 7
    assert len(sink.requests) < 16  # a bisection, not a retry loop


def test_a_refused_token_sets_the_whole_batch_aside_without_splitting(tmp_path: Path) -> None:
    sink = FakeSink([401])
    pub = publisher(tmp_path, sink, 4)
    assert pub.send_pending() == 4
    assert len(sink.requests) == 1
    assert len(pub.rejected.ids()) == 4
    assert len(pub.spool) == 0


def test_a_rejected_event_survives_a_restart_of_the_spool(tmp_path: Path) -> None:
    pub = publisher(tmp_path, FakeSink([403]), 1)
    pub.send_pending()
    again = Spool(tmp_path / "spool", log=lambda _: None)  # rejected/ is not an event
    assert len(again) == 0
    assert pub.rejected.ids() == [make_event(0, node=NODE).id]


# --- against the real API ---------------------------------------------------------------------


def test_coordinator_outage_loses_nothing_and_stores_each_event_once(
    tmp_path: Path, live: LiveCoordinator
) -> None:
    spool = Spool(tmp_path / "agent-spool", log=lambda _: None)
    link = CoordinatorLink(live.url, live.node_tokens[NODE], NODE, timeout_s=5)
    lines: list[str] = []
    pub = Publisher(
        spool,
        link,
        RejectedStore(tmp_path / "rejected"),
        batch=50,
        backoff=Backoff(attempts=2**31, initial_s=0.02, max_s=0.2),
        log=lines.append,
    )
    stop, wake = threading.Event(), threading.Event()
    thread = threading.Thread(target=pub.run, args=(stop, wake), kwargs={"idle_s": 0.05})
    thread.start()
    try:
        first = [make_event(i, node=NODE) for i in range(100)]
        for e in first:
            spool.put(e)
        wake.set()
        wait_for(lambda: len(live.stored_ids()) == 100, "the first 100 events")
        live.stop()
        later = [make_event(i, node=NODE) for i in range(100, 300)]
        for e in later + first[:10]:  # the first ten again: as after a lost acknowledgement
            spool.put(e)
        wake.set()
        wait_for(lambda: pub.stats.failures >= 3, "the publisher to fail during the outage")
        assert len(spool) == 210
        live.start()
        wait_for(lambda: len(spool) == 0, "the spool to empty after the restart")
    finally:
        stop.set()
        wake.set()
        thread.join()
        link.close()
    stored = live.stored_ids()
    assert sorted(stored) == sorted(e.id for e in first + later)
    assert len(stored) == len(set(stored)) == 300
    assert pub.stats.duplicates == 10
    assert any("retrying" in line for line in lines)
    assert any("reachable again" in line for line in lines)


def test_the_real_intake_refusing_an_event_puts_it_in_rejected(
    tmp_path: Path, live: LiveCoordinator
) -> None:
    spool = Spool(tmp_path / "agent-spool", log=lambda _: None)
    link = CoordinatorLink(live.url, live.node_tokens[NODE], NODE, timeout_s=5)
    pub = Publisher(spool, link, RejectedStore(tmp_path / "rejected"), log=lambda _: None)
    foreign = make_event(7, node="n2")  # n1's token may not report for n2: 403
    for e in (make_event(1, node=NODE), foreign, make_event(2, node=NODE)):
        spool.put(e)
    try:
        assert pub.send_pending() == 3
    finally:
        link.close()
    assert pub.rejected.ids() == [foreign.id]
    assert sorted(live.stored_ids()) == sorted(
        [make_event(1, node=NODE).id, make_event(2, node=NODE).id]
    )
