"""``recover train`` as K real processes joined by ``jax.distributed`` (gloo): interrupted and
resumed runs end bit for bit where an uninterrupted K-process run ends, a signal to any one
process stops all of them after the same step, a dead process stops the others at once, and
the bad inputs that concern K are answered clearly."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from recovery.checkpoint import CheckpointStore, RunLock
from recovery.contract.exits import EXIT_PREEMPTED
from recovery.multiproc import EXIT_PEER_LOST
from recovery.progress import Phase, read_records
from tests.train.conftest import run_cli, train_cmd, wait_for
from tests.train.multi import STOP_WITHIN_S, final_digest, launch, of, run

STEPS = 12  # tests.train.conftest.K2_STEPS


@pytest.fixture(scope="module")
def control(k2_control: tuple[int, str]) -> str:
    """Final digest of the uninterrupted 2-process run of mlp-tiny to ``STEPS``."""
    assert k2_control[0] == STEPS
    return k2_control[1]


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_after_the_same_step(
    tmp_path: Path, cache: Path, control: str
) -> None:
    """USR1 reaches only process 1 (the worst case of a signal reaching processes at
    different steps): both save the same step once, exit 75, and the resumed run ends with
    the control's digest."""
    run_dir = tmp_path / "run"
    job = launch(run_dir, 2, STEPS, 100, "--step-sleep", "0.1", "--compile-cache", str(cache))
    try:
        wait_for(lambda: len(of(run_dir, "step").get(1, [])) >= 2, what="two steps", timeout=240)
        job.signal(1, signal.SIGUSR1)
        codes = job.wait(STOP_WITHIN_S)
    finally:
        job.kill()
    assert codes == [EXIT_PREEMPTED] * 2, job.errors()
    pre = of(run_dir, "preempted")
    stops = [[e["step"] for e in pre[r]] for r in (0, 1)]
    assert stops[0] == stops[1]
    (stopped,) = stops[0]
    assert {e["signal"] for r in (0, 1) for e in pre[r]} == {"SIGUSR1"}
    assert CheckpointStore(run_dir / "checkpoints").steps() == [stopped]
    manifest = json.loads((run_dir / f"checkpoints/step_{stopped:08d}/manifest.json").read_text())
    assert manifest["metadata"] == {"data_position": stopped, "processes": 2}
    assert [f["name"] for f in manifest["files"]] == ["D00000.bin", "D00001.bin"]  # one each
    records = read_records(run_dir / "progress")
    assert sorted(records) == [0, 1]
    assert {(r.phase, r.step_finished, r.size) for r in records.values()} == {
        (Phase.done, stopped, 2)
    }
    # Each process timed its own share of every step apart from its wait for the other
    # (recovery/train/split_step.py): what the straggler rule compares.
    assert {r.compute_steps for r in records.values()} == {stopped}
    assert all(0 < r.compute_total_s < stopped * r.last_step_s for r in records.values())

    run(run_dir, 2, STEPS, 4, "--resume", "--compile-cache", str(cache))
    assert final_digest(run_dir, 2) == control
    joined = of(run_dir, "joined")
    assert [len(joined[r]) for r in (0, 1)] == [2, 2]
    assert {e["rank"] for e in joined[1]} == {1}
    assert {e["ranks"] for r in (0, 1) for e in joined[r]} == {2}
    assert (run_dir / "events.rank1.jsonl").exists()


@pytest.mark.slow
def test_a_process_that_dies_stops_the_others_and_nothing_is_damaged(
    tmp_path: Path, cache: Path, control: str
) -> None:
    """SIGABRT, the way a process on a lost GPU dies (no save): the other process stops by
    itself with status 76 and says why; the resumed run restores an intact step and ends
    with the control's digest."""
    run_dir = tmp_path / "run"
    job = launch(run_dir, 2, STEPS, 2, "--step-sleep", "0.1", "--compile-cache", str(cache))
    try:
        wait_for(lambda: bool(of(run_dir, "checkpoint").get(0)), what="a checkpoint", timeout=240)
        killed_at = job.signal(1, signal.SIGABRT)
        codes = job.wait(STOP_WITHIN_S)
    finally:
        job.kill()
    assert codes == [EXIT_PEER_LOST, -signal.SIGABRT], job.errors()
    (lost,) = of(run_dir, "peer-lost")[0]
    assert lost["lost_rank"] == 1
    assert lost["exit_code"] == EXIT_PEER_LOST
    assert "died or was killed" in lost["reason"]
    assert lost["heard_unix"] >= killed_at
    assert not of(run_dir, "peer-lost").get(1)  # the dead one wrote nothing more
    dead = read_records(run_dir / "progress")[1]
    assert dead.phase is not Phase.done  # a killed process never says it ended cleanly
    assert dead.pid == job.pid(1)

    resumed = launch(run_dir, 2, STEPS, 2, "--auto-resume", "--compile-cache", str(cache))
    assert resumed.wait() == [0, 0], resumed.errors()
    assert not of(run_dir, "fallback").get(0)
    assert final_digest(run_dir, 2) == control


@pytest.mark.slow
def test_a_process_that_fails_makes_the_others_end_with_its_status(
    tmp_path: Path, cache: Path
) -> None:
    """Process 0 cannot take the run lock (another writer holds it): it fails with status 3,
    and process 1, told why, ends with 3 too instead of waiting."""
    run_dir = tmp_path / "run"
    with RunLock(run_dir / "checkpoints").held():
        job = launch(run_dir, 2, STEPS, 4, "--compile-cache", str(cache), "--lock-wait", "0")
        codes = job.wait(STOP_WITHIN_S + 60)
    assert codes == [3, 3], job.errors()
    (lost,) = of(run_dir, "peer-lost")[1]
    assert lost["lost_rank"] == 0
    assert lost["exit_code"] == 3
    assert "RunLockedError" in lost["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("then", [1, 3])
def test_a_two_process_checkpoint_restores_with_another_count(
    tmp_path: Path, cache: Path, then: int
) -> None:
    """A different process count restores the replicated state as is (documented: from then
    on the run matches runs of the new count, not bit for bit the old one)."""
    run_dir = tmp_path / "run"
    model = ("--model", "mlp-tiny-48", "--compile-cache", str(cache))
    run(run_dir, 2, 4, 4, *model)
    saved = final_digest(run_dir, 2)
    if then == 1:
        done = run_cli(train_cmd(run_dir, 6, 2, "--resume", *model))
        assert done.returncode == 0, done.stderr
        log = done.stderr
    else:
        job = run(run_dir, then, 6, 2, "--resume", *model)
        log = job.logs[0].read_text()
    restored = of(run_dir, "restored")[0]
    assert restored[-1]["state_digest"] == saved
    assert restored[-1]["saved_processes"] == 2
    assert f"saved by 2 process(es); continuing with {then}" in log
    assert final_digest(run_dir, then) != saved


@pytest.mark.parametrize(
    ("env", "extra", "message"),
    [
        (
            {
                "RECOVER_NUM_PROCESSES": "3",
                "RECOVER_PROCESS_ID": "0",
                "RECOVER_RENDEZVOUS": "127.0.0.1:9",
            },
            (),
            "batch of 32 does not divide over 3 processes; models whose batch does: mlp-tiny-48",
        ),
        (
            {"RECOVER_NUM_PROCESSES": "2", "RECOVER_PROCESS_ID": "1"},
            (),
            "no RECOVER_RENDEZVOUS=HOST:PORT",
        ),
    ],
)
def test_bad_process_settings_are_refused_before_anything_starts(
    tmp_path: Path, env: dict[str, str], extra: tuple[str, ...], message: str
) -> None:
    done = run_cli(train_cmd(tmp_path / "run", 4, 2, *extra), env=env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "run").exists()
