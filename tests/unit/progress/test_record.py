"""Progress records: what the writer publishes is what a reader in another process gets back,
whole, and bad files are refused with a reason."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.progress import (
    Phase,
    ProgressWriter,
    RecordError,
    read_record,
    read_records,
    record_path,
)
from recovery.progress.record import RECORD_SIZE, parse


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_steps_and_phases_round_trip(tmp_path: Path) -> None:
    clock = Clock()
    w = ProgressWriter(tmp_path, rank=1, size=2, node="node2", clock=clock)
    # made whole beside it and renamed into place: never an empty file to read
    assert [p.name for p in tmp_path.iterdir()] == ["rank1.progress"]
    rec = read_record(record_path(tmp_path, 1))
    assert (rec.rank, rec.size, rec.node, rec.phase) == (1, 2, "node2", Phase.startup)
    assert (rec.step_started, rec.step_finished, rec.last_step_s) == (-1, -1, 0.0)

    clock.t = 1010.0
    w.step_started(1)
    rec = read_record(w.path)
    assert (rec.phase, rec.phase_since, rec.step_started, rec.in_step) == (
        Phase.steps, 1010.0, 1, True
    )  # fmt: skip
    clock.t = 1010.5
    w.step_finished(1)
    clock.t = 1011.0
    w.step_started(2)
    clock.t = 1011.5
    w.step_finished(2)
    rec = read_record(w.path)
    assert (rec.step_finished, rec.step_finished_at, rec.last_step_s, rec.in_step) == (
        2, 1011.5, 1.0, False
    )  # fmt: skip

    # An announced phase is not part of the time per step, and its budget is recorded.
    clock.t = 1012.0
    with w.phase("save", budget_s=30):
        rec = read_record(w.path)
        assert (rec.phase, rec.phase_since, rec.phase_budget_s) == (Phase.save, 1012.0, 30.0)
        clock.t = 1020.0
    rec = read_record(w.path)
    assert (rec.phase, rec.phase_since, rec.phase_budget_s) == (Phase.steps, 1020.0, 0.0)
    clock.t = 1020.5
    w.step_finished(3)  # a loop may report only ends
    rec = read_record(w.path)
    assert rec.step_started == 3
    assert rec.step_finished == 3
    assert rec.last_step_s == pytest.approx(1.0)  # 9 s since step 2, 8 of them saving

    w.close()
    assert read_record(w.path).phase is Phase.done


def test_close_without_done_leaves_the_record_as_it_was(tmp_path: Path) -> None:
    w = ProgressWriter(tmp_path)
    w.step_finished(1)
    w.close(done=False)
    rec = read_record(w.path)
    assert rec.phase is Phase.steps
    assert rec.step_finished == 1


def test_unknown_phase_and_negative_budget_are_refused(tmp_path: Path) -> None:
    w = ProgressWriter(tmp_path)
    with pytest.raises(UsageError, match=r"Unknown phase 'saving'.*evaluation.*save"):
        w.enter("saving")
    with pytest.raises(UsageError, match=">= 0"):
        w.enter("save", budget_s=-1)
    w.close()


def test_unwritable_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot write progress"):
        ProgressWriter(tmp_path / "file" / "progress")


def test_alive_thread_keeps_the_mark_fresh(tmp_path: Path) -> None:
    clock = Clock()
    w = ProgressWriter(tmp_path, clock=clock)
    clock.t = 2000.0
    w.start_alive(every_s=0.01)
    done = threading.Event()

    def fresh() -> None:
        while read_record(w.path).alive_at != 2000.0:
            pass
        done.set()

    threading.Thread(target=fresh, daemon=True).start()
    assert done.wait(10), "the liveness thread never wrote"
    w.close()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "0 bytes"),
        (b"XXXX" + bytes(RECORD_SIZE - 4), "not a progress record"),
    ],
)
def test_bad_records_are_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(RecordError, match=why):
        parse(data)


def test_read_records_skips_what_is_not_a_record(tmp_path: Path) -> None:
    ProgressWriter(tmp_path, rank=0, size=2).close(done=False)
    (tmp_path / "rank1.progress").write_bytes(b"half")
    (tmp_path / "notes.txt").write_text("x")
    assert list(read_records(tmp_path)) == [0]


def _hammer(directory: str, steps: int) -> None:
    w = ProgressWriter(Path(directory), rank=0)
    for n in range(1, steps + 1):
        w.step_started(n)
        w.step_finished(n)
    w.close()


def test_a_reader_never_sees_a_torn_record(tmp_path: Path) -> None:
    """Another process writes as fast as it can; every record read back is consistent
    (step_started == step_finished outside a step, one more inside, and the step never goes
    back)."""
    ProgressWriter(tmp_path).close(done=False)
    proc = multiprocessing.get_context("spawn").Process(
        target=_hammer, args=(str(tmp_path), 200_000)
    )
    proc.start()
    seen = -1
    reads = 0
    while proc.is_alive() or reads == 0:
        try:
            rec = read_record(record_path(tmp_path, 0))
        except RecordError as e:
            # A writer that never pauses can outrun every retry on a loaded machine (a real
            # loop writes once a step): the reader gives up rather than return a torn copy.
            if "changed while read" not in str(e):
                raise
            continue
        assert rec.step_finished >= seen
        # Outside a step both name the same step; inside, the next one. The hammer's first
        # step is 1, so before it finishes the record reads started 1, finished -1 (none yet).
        assert rec.step_started in (rec.step_finished, max(rec.step_finished, 0) + 1), rec
        seen = rec.step_finished
        reads += 1
    proc.join()
    assert proc.exitcode == 0
    assert read_record(record_path(tmp_path, 0)).step_finished == 200_000


def test_the_work_of_each_step_is_summed_for_the_straggler_rule(tmp_path: Path) -> None:
    w = ProgressWriter(tmp_path, rank=1, size=2)
    w.step_finished(1)  # a loop that cannot tell its own work from the wait: not counted
    w.step_finished(2, compute_s=0.25)
    w.step_finished(3, compute_s=0.5)
    rec = read_record(record_path(tmp_path, 1))
    assert (rec.compute_steps, rec.compute_total_s) == (2, 0.75)
    w.close()
