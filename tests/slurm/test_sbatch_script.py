"""The generated batch script: golden text, and its signal/requeue behaviour run by bash with a
stand-in training process and a recording ``scontrol`` (no Slurm needed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from recovery.contract.exits import EXIT_PREEMPTED
from recovery.errors import UsageError
from slurm.sbatch import (
    default_processes,
    render_batch_script,
    requeue_warning,
    training_job,
    with_auto_resume,
)
from tests.slurm.helpers import GOLDEN, TRAIN

# Saves and exits 75 on USR1 or TERM, like `recover train`; otherwise runs STEPS x 0.1 s.
STAND_IN = """\
#!/bin/bash
log=$1
trap 'echo USR1 >> "$log"; exit 75' USR1
trap 'echo TERM >> "$log"; exit 75' TERM
echo started >> "$log"
for i in $(seq 1 "$2"); do sleep 0.1; done
echo done >> "$log"
exit "${3:-0}"
"""


def test_script_matches_golden_file() -> None:
    script = render_batch_script(with_auto_resume(TRAIN), signal_lead_s=60)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text()


def test_training_job_options() -> None:
    job = training_job(TRAIN, sbatch_args=["--time=5", "-N", "1"], signal_lead_s=90)
    assert dict(job.options) == {
        "requeue": None,
        "open-mode": "append",
        "signal": "B:USR1@90",
        "job-name": "recover-train",
        "comment": "recover:train",  # our mark, whatever the name (recovery/contract/jobmark.py)
    }
    assert list(job.extra_args) == ["--time=5", "-N", "1"]
    assert "'/runs/demo 1'" in job.script
    assert "--auto-resume" in job.script


def test_auto_resume_is_added_only_to_recover_train_without_a_resume_flag() -> None:
    assert with_auto_resume(TRAIN)[-1] == "--auto-resume"
    assert with_auto_resume([*TRAIN, "--resume"]) == [*TRAIN, "--resume"]
    assert with_auto_resume([*TRAIN, "--auto-resume"]).count("--auto-resume") == 1
    py = ["python3", "-m", "recover", "train", "--steps", "3"]
    assert with_auto_resume(py)[-1] == "--auto-resume"
    assert with_auto_resume(["bash", "run.sh"]) == ["bash", "run.sh"]


@pytest.mark.parametrize("lead", [0, 70000])
def test_signal_lead_out_of_range_is_refused(lead: int) -> None:
    with pytest.raises(UsageError, match="expected 1 to 65535"):
        training_job(TRAIN, signal_lead_s=lead)


def test_empty_command_is_refused() -> None:
    with pytest.raises(UsageError, match="after '--'"):
        render_batch_script([], signal_lead_s=60)


def run_script(
    tmp_path: Path, *, steps: int, send: signal.Signals | None, exit_status: int = 0
) -> tuple[int, list[str], str]:
    """Run the generated script; optionally signal it once the stand-in started.

    Returns (exit status, stand-in log lines, recorded scontrol calls).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    stand_in = tmp_path / "train.sh"
    stand_in.write_text(STAND_IN)
    log = tmp_path / "train.log"
    script = tmp_path / "job.sbatch"
    script.write_text(
        render_batch_script(
            ["bash", str(stand_in), str(log), str(steps), str(exit_status)], signal_lead_s=60
        )
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    proc = subprocess.Popen(["bash", str(script)], env=env)
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and "started" in log.read_text()):
            assert time.monotonic() < deadline, "stand-in never started"
            time.sleep(0.02)
        if send is not None:
            proc.send_signal(send)
        status = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    recorded = calls.read_text() if calls.exists() else ""
    return status, log.read_text().split(), recorded


def test_usr1_is_forwarded_and_a_preempted_exit_requeues_the_job(tmp_path: Path) -> None:
    status, log, calls = run_script(tmp_path, steps=300, send=signal.SIGUSR1)
    assert log == ["started", "USR1"]
    assert calls == "requeue 42\n"
    assert status == 0


def test_term_is_forwarded_and_its_status_kept_without_requeue(tmp_path: Path) -> None:
    status, log, calls = run_script(tmp_path, steps=300, send=signal.SIGTERM)
    assert log == ["started", "TERM"]
    assert calls == ""
    assert status == EXIT_PREEMPTED


# Signals the batch shell first thing, possibly before that shell learnt its pid ($!). All of
# it is parsed before the signal goes out: bash 5.2 running a trap while it parses a `$(...)`
# later in the file fails the trap ("unexpected EOF while looking for matching `)'", seen in
# CI), and the stand-in then ran its whole loop instead of exiting 75.
SIGNALS_ITS_PARENT = """\
#!/bin/bash
trap 'echo TERM >> "$1"; exit 75' TERM
main() {
    kill -s TERM "$PPID"
    for ((i = 0; i < 300; i++)); do sleep 0.1; done
    echo done >> "$1"
}
main "$@"
"""


@pytest.mark.parametrize("attempt", range(5))
def test_a_signal_before_training_is_known_is_still_forwarded(tmp_path: Path, attempt: int) -> None:
    stand_in = tmp_path / "train.sh"
    stand_in.write_text(SIGNALS_ITS_PARENT)
    log = tmp_path / "train.log"
    script = tmp_path / "job.sbatch"
    script.write_text(render_batch_script(["bash", str(stand_in), str(log)], signal_lead_s=60))
    proc = subprocess.run(["bash", str(script)], timeout=20, check=False)
    assert (proc.returncode, log.read_text()) == (EXIT_PREEMPTED, "TERM\n")


@pytest.mark.parametrize("exit_status", [0, 3])
def test_a_normal_exit_keeps_its_status(tmp_path: Path, exit_status: int) -> None:
    status, log, calls = run_script(tmp_path, steps=2, send=None, exit_status=exit_status)
    assert log == ["started", "done"]
    assert (status, calls) == (exit_status, "")


# --- several processes: one srun step --------------------------------------------------------

GOLDEN_K3 = GOLDEN.with_name("train-k3.sbatch")

# Stand-ins for Slurm's commands as the K-process script uses them.
FAKE_SCONTROL = """\
#!/bin/bash
echo "$*" >> {calls}
case "$1 $2" in
  "show hostnames") printf 'node1\\nnode2\\nnode3\\nnode4\\n' ;;
  "show node") echo "NodeName=$3 Arch=x86_64 CoresPerSocket=1"
               echo "   NodeAddr=10.1.2.3 NodeHostName=host-$3 Version=22.05.8" ;;
  "requeue "*) exit {requeue_status} ;;
esac
"""
# srun: record the options and the rendezvous, then become the command (so signals reach it).
FAKE_SRUN = """\
#!/bin/bash
echo "$* RENDEZVOUS=$RECOVER_RENDEZVOUS" >> {calls}
while [ "${{1#--}}" != "$1" ]; do shift; done
exec "$@"
"""


def test_k_process_script_matches_golden_file() -> None:
    script = render_batch_script(with_auto_resume(TRAIN), signal_lead_s=60, processes=3)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN_K3.write_text(script)
    assert script == GOLDEN_K3.read_text()


def run_k_script(
    tmp_path: Path, *, send: signal.Signals | None, requeue_status: int = 0
) -> tuple[int, list[str], list[str]]:
    """Run the 3-process script with stand-ins for scontrol and srun; returns (exit status,
    stand-in log lines, recorded calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        fake = bin_dir / name
        fake.write_text(text.format(calls=calls, requeue_status=requeue_status))
        fake.chmod(0o755)
    stand_in = tmp_path / "train.sh"
    stand_in.write_text(STAND_IN)
    log = tmp_path / "train.log"
    script = tmp_path / "job.sbatch"
    script.write_text(
        render_batch_script(["bash", str(stand_in), str(log), "300"], signal_lead_s=60, processes=3)
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-4]",
    }
    proc = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and "started" in log.read_text()):
            assert time.monotonic() < deadline, "stand-in never started"
            time.sleep(0.02)
        if send is not None:
            proc.send_signal(send)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, log.read_text().split(), [*calls.read_text().splitlines(), err]


def test_k_processes_run_as_one_srun_step_meeting_at_the_first_nodes_address(
    tmp_path: Path,
) -> None:
    status, log, calls = run_k_script(tmp_path, send=signal.SIGUSR1)
    assert log == ["started", "USR1"]
    assert calls[0] == "show hostnames node[1-4]"
    assert calls[1] == "show node node1"
    srun, rendezvous = calls[2].split(" RENDEZVOUS=")
    assert srun.startswith(
        "--nodes=3 --ntasks=3 --ntasks-per-node=1 --nodelist=node1,node2,node3 "
        "--kill-on-bad-exit=1 bash "
    )
    host, port = rendezvous.split(":")
    assert host == "10.1.2.3"
    assert 1 <= int(port) <= 65535
    assert calls[3] == "requeue 42"
    assert status == 0


def test_a_job_that_cannot_be_requeued_says_how_to_resume(tmp_path: Path) -> None:
    """Submitted with --no-requeue: scontrol refuses; the checkpoint is kept, the job ends
    with the preempted status, and the output says what to do."""
    status, log, calls = run_k_script(tmp_path, send=signal.SIGUSR1, requeue_status=1)
    assert log == ["started", "USR1"]
    assert status == EXIT_PREEMPTED
    assert "cannot be requeued (--no-requeue?)" in calls[-1]
    assert "submit the same command to resume" in calls[-1]


def test_processes_default_to_one_per_requested_node_for_recover_train() -> None:
    assert default_processes(TRAIN, ["-N", "3"]) == 3
    assert default_processes(TRAIN, ["--nodes=2", "--time=5"]) == 2
    assert default_processes(TRAIN, ["-N4", "--nodes", "2"]) == 2  # the last one wins
    assert default_processes(TRAIN, []) == 1
    assert default_processes(TRAIN, ["-N", "2-4"]) == 1
    assert default_processes(["bash", "run.sh"], ["-N", "3"]) == 1


def test_k_processes_ask_for_k_nodes_unless_told() -> None:
    job = training_job(TRAIN, processes=3)
    assert job.options["nodes"] == "3"
    assert "--ntasks=3" in job.script
    assert "nodes" not in training_job(TRAIN, sbatch_args=["-N", "4"], processes=3).options
    assert "srun" not in training_job(TRAIN, sbatch_args=["-N", "4"]).script


@pytest.mark.parametrize(
    ("args", "processes", "message"),
    [
        (["-N", "2"], 3, "--processes 3 is more than the job's 2 node(s) (-N 2)"),
        (["--nodes=2-4"], 2, "need a fixed node count"),
        ([], 0, "expected 1 or more"),
    ],
)
def test_bad_process_counts_are_refused(args: list[str], processes: int, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        training_job(TRAIN, sbatch_args=args, processes=processes)


def test_no_requeue_is_warned_about() -> None:
    assert requeue_warning(["--time=5"]) is None
    warning = requeue_warning(["--no-requeue"])
    assert warning is not None
    assert "resumes from its newest checkpoint" in warning
