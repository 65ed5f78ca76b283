"""Actions on several nodes at once, and signals to a job, on the real cluster, per backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from recovery.ports.slurm import BatchJob, SlurmControl
from slurm.cli_slurm import CliSlurm
from tests.slurm.helpers import finished, wait_for

pytestmark = pytest.mark.slurm

NODES = ["node1", "node2", "node3"]
THEIRS = "rma (bob)"


Update = tuple[list[str], str, str]


def count_updates(ctl: SlurmControl, monkeypatch: pytest.MonkeyPatch) -> list[Update]:
    """Record every node update request ``ctl`` sends from now on, as (nodes, state, reason),
    and still send it (``_request_update`` is where both backends send one)."""
    seen: list[Update] = []
    real = ctl._request_update  # type: ignore[attr-defined]

    def update(nodes: Sequence[str], state: str, reason: str) -> None:
        seen.append((list(nodes), state, reason))
        real(nodes, state, reason)

    monkeypatch.setattr(ctl, "_request_update", update)
    return seen


def states(ctl: SlurmControl) -> dict[str, tuple[bool, bool, str]]:
    """(down, drained, reason) of each compute node."""
    return {n.name: (n.down, n.drained, n.reason) for n in ctl.nodes() if n.name in NODES}


@pytest.mark.writes("down", "down_many")
def test_down_many_takes_the_nodes_that_need_it_out_with_one_call(
    slurm_backend: SlurmControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert slurm_backend.down("node1", "xid79 gpu fell off the bus") is True
    updates = count_updates(slurm_backend, monkeypatch)
    assert slurm_backend.down_many(NODES, "xid79 gpu fell off the bus") == ["node2", "node3"]
    reason = "recover: xid79 gpu fell off the bus"
    assert updates == [(["node2", "node3"], "DOWN", reason)]
    assert states(slurm_backend) == dict.fromkeys(NODES, (True, False, reason))
    assert slurm_backend.down_many(NODES, "xid79 gpu fell off the bus") == []  # holds: no-op
    assert len(updates) == 1


@pytest.mark.writes("drain_many", "down_many")
def test_drain_many_then_down_many_keep_another_owners_reason(
    slurm_backend: SlurmControl, slurm_ctl: CliSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm_ctl.run(["scontrol", "update", "NodeName=node1", "State=DRAIN", f"Reason={THEIRS}"])
    updates = count_updates(slurm_backend, monkeypatch)
    assert slurm_backend.drain_many(NODES, "xid48 ECC") == ["node2", "node3"]
    assert len(updates) == 1
    assert states(slurm_backend) == {
        "node1": (False, True, THEIRS),
        "node2": (False, True, "recover: xid48 ECC"),
        "node3": (False, True, "recover: xid48 ECC"),
    }
    # DOWN for all three: theirs goes DOWN with their reason (one request per reason written).
    assert slurm_backend.down_many(NODES, "xid48 ECC") == NODES
    assert sorted(u[0] for u in updates[1:]) == [["node1"], ["node2", "node3"]]
    assert states(slurm_backend) == {
        "node1": (True, True, THEIRS),
        "node2": (True, True, "recover: xid48 ECC"),  # DOWN+DRAIN: Slurm keeps the flag
        "node3": (True, True, "recover: xid48 ECC"),
    }
    assert slurm_backend.down_many(NODES, "xid48 ECC") == []
    assert len(updates) == 3
    assert slurm_backend.node("node1").held_by_other


TRAPS_USR1 = """#!/bin/bash
trap 'echo got-usr1 >> "$OUT"; exit 0' USR1
echo started >> "$OUT"
for i in $(seq 1 600); do sleep 0.2 & wait $!; done
"""


def test_signal_job_reaches_the_batch_shell(slurm_backend: SlurmControl, job_dir: Path) -> None:
    out = job_dir / "marks"
    job_id = slurm_backend.submit(
        BatchJob(
            script=TRAPS_USR1,
            options={
                "job-name": "traps",
                "output": str(job_dir / "%j.out"),
                "export": f"ALL,OUT={out}",
            },
            workdir=str(job_dir),
        )
    )
    wait_for(lambda: out.exists() and "started" in out.read_text(), 15, "job started, trap set")
    assert slurm_backend.signal_job(job_id, "USR1") is True
    wait_for(lambda: "got-usr1" in out.read_text(), 10, "USR1 trapped by the batch shell")
    ended = wait_for(lambda: finished(slurm_backend, job_id), 10, "job ended")
    assert ended.state == "COMPLETED"  # the trap's exit 0: the job was not killed
    assert slurm_backend.signal_job(job_id, "USR1") is False  # finished: nothing to signal
    assert slurm_backend.signal_job("999999", "USR1") is False  # never existed
