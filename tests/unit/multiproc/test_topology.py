"""Where a process sits, read from a launcher's environment; and the wire framing."""

from __future__ import annotations

import pytest

from recovery.errors import UsageError
from recovery.multiproc import Topology, parse_address, topology_from_env, wire

SRUN_TASK = {
    "SLURM_JOB_ID": "41",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_PROCID": "2",
    "SLURMD_NODENAME": "node3",
    "RECOVER_RENDEZVOUS": "10.0.0.7:29400",
}


def test_no_launcher_is_one_process() -> None:
    assert topology_from_env({}) == Topology(rank=0, size=1)


def test_the_batch_step_is_one_process_whatever_the_node_count() -> None:
    """sbatch -N 4 sets no step task count in the batch script: only srun starts several."""
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "4", "SLURM_PROCID": "0", "SLURMD_NODENAME": "n1"}
    assert topology_from_env(env) == Topology(rank=0, size=1, node="n1")


def test_an_srun_task() -> None:
    topo = topology_from_env({**SRUN_TASK, "SLURM_RESTART_COUNT": "2"})
    assert (topo.rank, topo.size, topo.rendezvous, topo.node) == (
        2,
        3,
        ("10.0.0.7", 29400),
        "node3",
    )
    assert topo.group_id == "41.0.2@29400"
    assert topo.multi


def test_our_variables_win_over_slurms() -> None:
    env = {**SRUN_TASK, "RECOVER_NUM_PROCESSES": "2", "RECOVER_PROCESS_ID": "1"}
    topo = topology_from_env(env)
    assert (topo.rank, topo.size) == (1, 2)


def test_one_srun_task_is_a_single_process() -> None:
    env = {**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}
    assert not topology_from_env(env).multi


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**SRUN_TASK, "RECOVER_RENDEZVOUS": ""}, "no RECOVER_RENDEZVOUS=HOST:PORT"),
        ({"RECOVER_NUM_PROCESSES": "2"}, "set both RECOVER_NUM_PROCESSES and RECOVER_PROCESS_ID"),
        ({**SRUN_TASK, "SLURM_PROCID": "3"}, "need a count >= 1 and 0 <= rank < count"),
        ({**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "many"}, "'many' is not a whole number"),
        ({**SRUN_TASK, "RECOVER_RENDEZVOUS": "node1"}, "is not HOST:PORT"),
        ({**SRUN_TASK, "RECOVER_RENDEZVOUS": "h:70000"}, "a port from 1 to 65535"),
    ],
)
def test_bad_environments_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        topology_from_env(env)


def test_addresses() -> None:
    assert parse_address("127.0.0.1:1") == ("127.0.0.1", 1)
    assert parse_address("[fe80::1]:29400") == ("fe80::1", 29400)
    with pytest.raises(UsageError):
        parse_address(":80")


def test_framing_survives_any_split_and_refuses_garbage() -> None:
    data = wire.encode({"op": "a", "v": [1, 2]}) + wire.encode({"op": "b"})
    for cut in range(len(data) + 1):
        framer = wire.Framer()
        got = framer.feed(data[:cut]) + framer.feed(data[cut:])
        assert [m["op"] for m in got] == ["a", "b"]
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.Framer().feed(b"\x00\x00\x00\x02{x")
    with pytest.raises(wire.WireError, match="not a message"):
        wire.Framer().feed(b"\x00\x00\x00\x02[]")
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.Framer().feed(b"\xff\xff\xff\xff")
