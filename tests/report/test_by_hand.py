"""``recover report DIR`` on runs started by hand: only the job's event logs and checkpoints,
none of the scenario runner's files. The report tells what the events tell and says what it
cannot know; a directory with no event log is answered with the files expected."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recover import main
from recovery.api import CheckpointManager, open_event_log, read_events
from recovery.report import RESTART_PHASES, build_report, load_run
from recovery.report.run import INCIDENTS_FILE, RUN_FILE
from scenarios.expect import Check, Outcome, check, progress
from scenarios.schema import Expectations
from tests.report.helpers import copy_sample
from tests.train.conftest import events, run_cli, train_cmd, wait_for

SAVE_EVERY = 4
SLURM = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3"}


def _loop(
    run_dir: Path,
    steps: int,
    clock: Callable[[], float],
    *,
    stop_after: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """A training loop of one's own on recovery.api, shaped as docs/library.md's quickstart
    (no ``warmup`` event). ``stop_after``: end after that step with no final save and no
    ``completed``, as a killed process leaves its log."""
    log = open_event_log(run_dir, environ=environ or {}, clock=clock)
    manager = CheckpointManager(
        run_dir / "checkpoints", async_save=False, events=log, clock=clock, run_config={"s": 1}
    )
    template = {"w": np.zeros(3, np.float32)}
    with manager:
        log.emit("started", step=None, target_steps=steps)
        restored = manager.restore_or_none(template)
        state, step = (restored.state, restored.step) if restored else (template, 0)
        while step < steps:
            state = {"w": state["w"] + 1}
            step += 1
            log.emit("step", step=step, step_s=0.5)
            if step == stop_after:
                break
            if step % SAVE_EVERY == 0:
                manager.save(step, state)
        else:
            if step % SAVE_EVERY:
                manager.save(step, state)
            log.emit("completed", step=step, state_digest="d" * 32)
    log.close()


def _clock() -> Callable[[], float]:
    """A wall clock one second further on at every reading."""
    return itertools.count(1_000_000.0, 1.0).__next__


def _by_hand(run_dir: Path, *, environ: Mapping[str, str] | None = None) -> Path:
    """Killed after step 6 (checkpoint 4 durable), then run again to 8: 2 steps redone."""
    clock = _clock()
    _loop(run_dir, 8, clock, stop_after=6, environ=environ)
    _loop(run_dir, 8, clock, environ=environ)
    return run_dir


def test_a_run_of_ones_own_loop_is_reported_from_its_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _by_hand(tmp_path / "run", environ=SLURM)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "events.jsonl"]
    assert main(["report", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["missing"] == [RUN_FILE, INCIDENTS_FILE]
    assert doc["incidents"] == []
    assert (doc["job"]["id"], doc["job"]["nodes"], doc["job"]["steps"]) == ("77", ["node3"], 8)
    assert doc["job"]["save_every"] is None  # this loop's started event does not say
    assert [(p["outcome"], p["checkpoints"]) for p in doc["processes"]] == [
        ("killed", [4]),
        ("completed", [8]),
    ]
    assert (doc["completed"], doc["final_step"], doc["steps_recomputed"]) == (True, 8, 2)
    [restart] = doc["restarts"]
    assert restart["before"] == "killed"
    assert (restart["restored_step"], restart["high_water_step"]) == (4, 6)
    assert restart["steps_recomputed"] == 2
    assert list(restart["phases"]) == list(RESTART_PHASES)
    assert all(restart["phases"][p] is not None for p in RESTART_PHASES), restart["why"]
    log = list(read_events(run_dir / "events.jsonl"))
    again = next(i for i, e in enumerate(log) if e["event"] == "started" and i > 0)
    assert restart["phases"]["gap"] == log[again]["ts"] - log[again - 1]["ts"]
    for name in ("report.json", "report.md", "timeline.png"):
        assert (run_dir / name).stat().st_size > 0


def test_the_table_says_what_the_events_tell_and_what_is_not_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _by_hand(tmp_path / "run")
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run started by hand: {run_dir}\njob (8 steps); wall ")
    assert (
        "2 run(s) of the job, 1 restart(s); restored step(s) 4; 2 checkpoint(s), the last at "
        "step 8; 2 step(s) recomputed; reached step 8"
    ) in out
    assert "incidents: not known (no journal)" in out
    assert "restart 1, after run 0 killed: restored step 4; step 6 had been reached" in out
    assert "no incident\n" not in out
    assert "- no run.json (the scenario runner's record)" in out
    assert "- no incidents.json (the coordinator's journal): no incident is known" in out
    md = (run_dir / "report.md").read_text()
    assert md.startswith("# Run report: a run started by hand")
    assert "No incident was opened" not in md
    assert "## What this report cannot tell" in md


def test_the_report_and_the_expectation_count_the_same_recomputed_steps(tmp_path: Path) -> None:
    run_dir = _by_hand(tmp_path / "run")
    counted = progress(list(read_events(run_dir / "events.jsonl")))
    assert counted.steps_recomputed == build_report(load_run(run_dir)).steps_recomputed == 2
    out = Outcome("COMPLETED", None, None, counted, incidents=[])
    got = {c.name: c for c in check(Expectations(max_steps_recomputed=1), out)}
    assert got["max_steps_recomputed"] == Check(
        "max_steps_recomputed", False, "2 steps recomputed, at most 1 allowed (1 over)"
    )


def test_a_journal_excerpt_beside_the_events_gives_the_incidents(tmp_path: Path) -> None:
    run_dir = copy_sample("xid79-spare", tmp_path)
    (run_dir / RUN_FILE).unlink()
    report = build_report(load_run(run_dir))
    assert report.missing == (RUN_FILE,)
    assert report.journal_known
    [inc] = report.incidents
    assert inc.fault_source == "observed by the agent (no injection in run.json)"
    assert inc.steps_recomputed == report.restarts[0].steps_recomputed
    [unknown] = report.unknown
    assert unknown.startswith("no run.json")


def test_the_other_ranks_logs_are_read_as_the_lines_count_them(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for rank in (0, 1):
        env = {"RECOVER_NUM_PROCESSES": "3", "RECOVER_PROCESS_ID": str(rank),
               "RECOVER_RENDEZVOUS": "127.0.0.1:1"}  # fmt: skip
        log = open_event_log(run_dir, environ=env, clock=_clock())
        log.emit("started", step=None)
        log.emit("step", step=1, step_s=0.5)
        log.close()
    assert sorted(p.name for p in run_dir.iterdir()) == ["events.jsonl", "events.rank1.jsonl"]
    report = build_report(load_run(run_dir))
    # Rank 2 never wrote a line: it counts, with no process.
    assert [len(r) for r in report.ranks] == [1, 1, 0]
    assert report.job.processes == report.goodput.processes == 3


def test_a_directory_with_no_event_log_names_the_files_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} holds no event log: expected events.jsonl" in err
    assert "run.json and incidents.json" in err
    (tmp_path / "events.rank1.jsonl").write_text("")
    assert main(["report", str(tmp_path)]) == 2
    assert "found only events.rank1.jsonl" in capsys.readouterr().err
    (tmp_path / "events.jsonl").write_text("")
    assert main(["report", str(tmp_path)]) == 2
    assert "events.jsonl holds no event: nothing to report on" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()


def _train(run_dir: Path, *extra: str) -> list[str]:
    return train_cmd(run_dir, 12, SAVE_EVERY, "--model", "mlp-tiny", *extra)


@pytest.mark.slow
def test_recover_train_killed_then_resumed_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``recover train`` SIGKILLed past a checkpoint, then run again with --auto-resume."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_train(run_dir, "--step-sleep", "0.3"), stderr=subprocess.PIPE)
    try:

        def past_a_checkpoint() -> bool:
            log = events(run_dir)
            saved = [e["step"] for e in log if e["event"] == "checkpoint"]
            return bool(saved) and any(e["event"] == "step" and e["step"] > saved[0] for e in log)

        wait_for(past_a_checkpoint, timeout=120, what="a step past the first checkpoint")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        assert proc.stderr is not None
        proc.stderr.close()
    first: list[dict[str, Any]] = events(run_dir)
    reached = max(e["step"] for e in first if e["event"] == "step")
    durable = max(e["step"] for e in first if e["event"] == "checkpoint")
    done = run_cli(_train(run_dir, "--auto-resume"))
    assert done.returncode == 0, done.stderr

    assert main(["report", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [restart] = doc["restarts"]
    assert (restart["before"], restart["restored_step"]) == ("killed", durable)
    assert restart["high_water_step"] == reached
    assert doc["steps_recomputed"] == reached - durable > 0
    assert (doc["job"]["steps"], doc["job"]["save_every"], doc["job"]["model"]) == (
        12, SAVE_EVERY, "mlp-tiny"
    )  # fmt: skip
    assert (doc["completed"], doc["final_step"]) == (True, 12)
    # recover train writes warmup; the count is the same as without it.
    assert progress(events(run_dir)).steps_recomputed == reached - durable
