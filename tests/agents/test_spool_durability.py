"""The spool's order of operations, recorded through a stand-in for ``os``, and its
bookkeeping: bounds, drops, order, idempotence, restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import spool as spool_mod
from agents.spool import Spool
from tests.agents.helpers import TracingOs, make_event


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> TracingOs:
    tracer = TracingOs()
    monkeypatch.setattr(spool_mod, "os", tracer)
    return tracer


def test_put_makes_the_event_durable_before_returning(tmp_path: Path, traced: TracingOs) -> None:
    spool = Spool(tmp_path / "spool")
    root = spool.directory
    traced.trace.clear()

    assert spool.put(make_event(1))

    tmp = root / ".tmp-0000000000000000"
    final = root / "0000000000000000.json"
    i_open = traced.index("open", tmp)
    i_write = traced.index("write", tmp, after=i_open)
    i_fsync = traced.index("fsync", tmp, after=i_write)
    i_rename = traced.index("rename", tmp, final, after=i_fsync)
    i_dir = traced.index("fsync", root, after=i_rename)
    assert i_dir == len(traced.trace) - 1, f"put did more after its commit:\n{traced}"
    writes = [i for i, (op, p, _) in enumerate(traced.trace) if op == "write"]
    assert all(i < i_fsync for i in writes), "written after its fsync"
    assert final.read_bytes() == make_event(1).model_dump_json().encode()


def test_ack_unlinks_then_makes_the_removal_durable(tmp_path: Path, traced: TracingOs) -> None:
    spool = Spool(tmp_path / "spool")
    spool.put(make_event(1))
    traced.trace.clear()

    assert spool.ack(make_event(1).id)

    final = spool.directory / "0000000000000000.json"
    i_unlink = traced.index("unlink", final)
    traced.index("fsync", spool.directory, after=i_unlink)
    assert not final.exists()
    assert not spool.ack(make_event(1).id), "acknowledged twice"


def test_a_new_spool_directory_is_itself_made_durable(tmp_path: Path, traced: TracingOs) -> None:
    Spool(tmp_path / "spool")
    traced.index("fsync", tmp_path)


def test_restart_keeps_confirmed_events_in_order_and_drops_unconfirmed(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    for n in range(5):
        spool.put(make_event(n))
    spool.ack(make_event(2).id)
    (spool.directory / ".tmp-0000000000000009").write_bytes(b'{"half": ')  # a killed put

    again = Spool(tmp_path / "spool")

    assert [s.event for s in again.pending()] == [make_event(n) for n in (0, 1, 3, 4)]
    assert not list(spool.directory.glob(".tmp-*"))
    assert again.put(make_event(9))
    assert [s.seq for s in again.pending()][-1] == 5, "sequence numbers continue"
    assert again.nbytes == sum(s.nbytes for s in again.pending())


def test_an_id_already_spooled_is_not_written_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    assert spool.put(make_event(1))
    assert spool.put(make_event(1))
    assert len(spool) == 1
    assert len(list(spool.directory.glob("*.json"))) == 1
    assert Spool(tmp_path / "spool").put(make_event(1))
    assert len(list(spool.directory.glob("*.json"))) == 1


def test_a_full_spool_drops_the_newest_and_logs_once_per_burst(tmp_path: Path) -> None:
    logs: list[str] = []
    spool = Spool(tmp_path / "spool", max_events=3, log=logs.append)
    assert all(spool.put(make_event(n)) for n in range(3))
    assert [spool.put(make_event(n)) for n in range(3, 10)] == [False] * 7
    assert spool.dropped == 7
    assert len(logs) == 1
    assert "full (3 events" in logs[0]
    assert make_event(3).id in logs[0]
    assert [s.event.id for s in spool.pending()] == [make_event(n).id for n in range(3)]

    spool.ack(make_event(0).id)
    assert spool.put(make_event(10))
    assert len(logs) == 2
    assert "7 events were dropped while full" in logs[1]
    assert not spool.put(make_event(11))
    assert len(logs) == 3, "a new burst gets its own line"
    assert spool.dropped == 8


def test_the_byte_bound_counts_file_contents(tmp_path: Path) -> None:
    one = len(make_event(0, size=1000).model_dump_json())
    small = len(make_event(3, size=5).model_dump_json())
    assert small < one - 500
    spool = Spool(tmp_path / "spool", max_bytes=2 * one + small, log=lambda _: None)
    assert spool.put(make_event(0, size=1000))
    assert spool.put(make_event(1, size=1000))
    assert not spool.put(make_event(2, size=1000))
    assert spool.put(make_event(3, size=5)), "a small one still fits"
    assert spool.nbytes <= spool.max_bytes


def test_a_damaged_file_is_kept_aside_not_deleted(tmp_path: Path) -> None:
    logs: list[str] = []
    spool = Spool(tmp_path / "spool")
    spool.put(make_event(0))
    (spool.directory / "0000000000000007.json").write_text("not json")
    again = Spool(tmp_path / "spool", log=logs.append)
    assert [s.event.id for s in again.pending()] == [make_event(0).id]
    assert (spool.directory / ".bad-0000000000000007.json").exists()
    assert "not a valid event" in logs[0]


@pytest.mark.parametrize(("events", "size"), [(0, 10), (10, 0)])
def test_bounds_must_be_positive(tmp_path: Path, events: int, size: int) -> None:
    with pytest.raises(ValueError, match="bounds must be >= 1"):
        Spool(tmp_path / "spool", max_events=events, max_bytes=size)
