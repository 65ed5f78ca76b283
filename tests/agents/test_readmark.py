"""Read marks: saved atomically beside the spool, of this boot only, and moved on by the agent's
pipeline only once the line's event is on disk (or folded into an open window)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.readmark import MARK_FILES, Mark, MarkFile
from agents.runtime import Agent, AgentConfig
from recovery.model import HealthEvent, Source
from recovery.ports.clock import FakeClock

BOOT = "b1"


def test_a_saved_mark_is_loaded_for_its_own_boot_only(tmp_path: Path) -> None:
    marks = MarkFile(tmp_path / ".kmsg-mark.json")
    assert marks.load(BOOT) is None  # none saved yet
    mark = Mark(BOOT, seq=1742)
    marks.note(mark)
    assert marks.save()
    assert not marks.save()  # unchanged: not written again
    assert MarkFile(tmp_path / ".kmsg-mark.json").load(BOOT) == mark
    assert MarkFile(tmp_path / ".kmsg-mark.json").load("b2") is None  # another boot


def test_a_damaged_mark_is_said_and_the_boot_read_again(tmp_path: Path) -> None:
    path = tmp_path / ".kmsg-mark.json"
    logs: list[str] = []
    for damage in ("{not json", json.dumps({"boot_id": BOOT, "seqq": 3})):
        path.write_text(damage)
        assert MarkFile(path, log=logs.append).load(BOOT) is None
    assert len(logs) == 2
    assert all("reading this boot's log again" in line for line in logs)


def test_a_held_mark_stays_where_it_is(tmp_path: Path) -> None:
    logs: list[str] = []
    marks = MarkFile(tmp_path / "m.json", log=logs.append)
    marks.note(Mark(BOOT, seq=1))
    marks.hold()
    marks.hold()
    marks.note(Mark(BOOT, seq=2))
    marks.save()
    assert MarkFile(tmp_path / "m.json").load(BOOT) == Mark(BOOT, seq=1)
    assert len(logs) == 1


def _event(n: int) -> HealthEvent:
    return HealthEvent(
        id=f"n1:kmsg:{n:06d}", node="n1", source=Source.kmsg, fault="xid79",
        accelerator=n, observed_at=1.8e9,
    )  # fmt: skip


@pytest.fixture
def agent(tmp_path: Path, clock: FakeClock) -> Agent:
    config = AgentConfig(
        node="n1", coordinator="http://127.0.0.1:9", token="t" * 32,
        spool_dir=tmp_path / "spool", sources=("kmsg",),
    )  # fmt: skip
    return Agent(config, clock=clock, log=lambda line: None, boot_id=BOOT)


def test_the_mark_moves_once_the_event_is_spooled_and_is_saved_per_burst(
    agent: Agent, tmp_path: Path
) -> None:
    marks = agent._mark_file("kmsg")
    for n in range(3):
        agent.emit_marked(marks, _event(n), Mark(BOOT, seq=n))
    for _ in range(3):
        agent._settle(agent._queue.get_nowait())
    assert len(agent.spool) == 3
    assert not marks.path.exists()  # noted, not yet written: the burst is still settling
    agent._save_marks()
    assert marks.load(BOOT) == Mark(BOOT, seq=2)
    assert (tmp_path / "spool" / MARK_FILES["kmsg"]) == marks.path


def test_an_event_that_cannot_be_spooled_holds_the_mark_before_its_line(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = agent._mark_file("kmsg")
    agent.emit_marked(marks, _event(0), Mark(BOOT, seq=0))
    agent._settle(agent._queue.get_nowait())

    def disk_full(event: HealthEvent) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(agent.spool, "put", disk_full)
    agent.emit_marked(marks, _event(1), Mark(BOOT, seq=1))
    agent._settle(agent._queue.get_nowait())
    monkeypatch.undo()
    agent.emit_marked(marks, _event(2), Mark(BOOT, seq=2))  # spooled, after the lost one
    agent._settle(agent._queue.get_nowait())
    agent._save_marks()
    assert marks.load(BOOT) == Mark(BOOT, seq=0)  # a restart reads lines 1 and 2 again
