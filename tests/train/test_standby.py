"""``recover train`` as a standby (RECOVER_STANDBY=1, recovery.train.standby): it waits for its
place in a launch on stdin and then trains as any process; end of input ends it having done
nothing; a malformed assignment is refused naming what may be set."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.multiproc import free_port, topology_from_env
from recovery.train.standby import ASSIGNABLE, parse_assignment
from tests.train.conftest import K2_STEPS, train_cmd
from tests.train.multi import final_digest


def _standby(run_dir: Path, steps: int, *extra: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RECOVER_STANDBY": "1"}
    for name in ("RECOVER_NUM_PROCESSES", "RECOVER_PROCESS_ID", "RECOVER_RENDEZVOUS"):
        env.pop(name, None)
    with log.open("wb") as err:
        return subprocess.Popen(
            train_cmd(run_dir, steps, 4, *extra),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _tell(proc: subprocess.Popen[bytes], text: str) -> None:
    """Write ``text`` to the standby's input and close it."""
    assert proc.stdin is not None
    proc.stdin.write(text.encode())
    proc.stdin.close()


@pytest.mark.slow
def test_two_standbys_given_their_ranks_train_as_a_launch_would(
    tmp_path: Path, cache: Path, k2_control: tuple[int, str]
) -> None:
    run_dir = tmp_path / "run"
    logs = [tmp_path / f"standby{r}.log" for r in range(2)]
    procs = [_standby(run_dir, K2_STEPS, "--compile-cache", str(cache), log=g) for g in logs]
    port = free_port()
    try:
        for rank, proc in enumerate(procs):
            line = {
                "RECOVER_PROCESS_ID": str(rank),
                "RECOVER_NUM_PROCESSES": "2",
                "RECOVER_RENDEZVOUS": f"127.0.0.1:{port}",
                "RECOVER_GROUP": "test.launch1",
            }
            _tell(proc, json.dumps(line) + "\n")
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0], [g.read_text()[-2000:] for g in logs]
    assert final_digest(run_dir, 2) == k2_control[1]


def test_end_of_input_ends_a_standby_having_done_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "standby.log"
    proc = _standby(run_dir, 4, log=log)
    _tell(proc, "")
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert not run_dir.exists()


def test_a_bad_assignment_is_refused_naming_what_may_be_set(tmp_path: Path) -> None:
    log = tmp_path / "standby.log"
    proc = _standby(tmp_path / "run", 4, log=log)
    _tell(proc, '{"PATH": "/tmp"}\n')
    assert proc.wait(timeout=120) == 2, log.read_text()
    assert "may set only RECOVER_GROUP, RECOVER_NUM_PROCESSES" in log.read_text()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("not json\n", "not JSON"),
        ('["a"]\n', "object of strings"),
        ('{"RECOVER_PROCESS_ID": 1}\n', "object of strings"),
        ('{"LD_PRELOAD": "x.so"}\n', "sets LD_PRELOAD; it may set only"),
    ],
)
def test_parse_assignment_refuses(line: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        parse_assignment(line)


def test_parse_assignment_takes_the_launch_variables_and_an_empty_line_is_none() -> None:
    doc = {name: "1" for name in ASSIGNABLE}
    assert parse_assignment(json.dumps(doc) + "\n") == doc
    assert parse_assignment("\n") is None
    assert parse_assignment("") is None


def test_the_launch_group_names_the_launch_when_given() -> None:
    env = {
        "RECOVER_NUM_PROCESSES": "2",
        "RECOVER_PROCESS_ID": "1",
        "RECOVER_RENDEZVOUS": "10.0.0.1:2345",
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "3",
    }
    assert topology_from_env(env).group_id == "7.3.-@2345"
    assert topology_from_env({**env, "RECOVER_GROUP": "7.launch2"}).group_id == "7.launch2@2345"
