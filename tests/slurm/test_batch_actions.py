"""Actions on several nodes at once, and signals to a job's batch step, on the real cluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from recovery.ports.slurm import BatchJob
from slurm.cli_slurm import CliSlurm
from tests.slurm.helpers import finished, wait_for

pytestmark = pytest.mark.slurm

NODES = ["node1", "node2", "node3"]
THEIRS = "rma (bob)"


def count_updates(ctl: CliSlurm, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record every ``scontrol update`` ``ctl`` runs from now on (and still run it)."""
    seen: list[list[str]] = []
    real = ctl.run

    def run(argv: Sequence[str], *, stdin: str | None = None) -> str:
        if list(argv[:2]) == ["scontrol", "update"]:
            seen.append(list(argv))
        return real(argv, stdin=stdin)

    monkeypatch.setattr(ctl, "run", run)
    return seen


def states(ctl: CliSlurm) -> dict[str, tuple[bool, bool, str]]:
    """(down, drained, reason) of each compute node."""
    return {n.name: (n.down, n.drained, n.reason) for n in ctl.nodes() if n.name in NODES}


def test_down_many_takes_the_nodes_that_need_it_out_with_one_call(
    slurm_ctl: CliSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert slurm_ctl.down("node1", "xid79 gpu fell off the bus") is True
    updates = count_updates(slurm_ctl, monkeypatch)
    assert slurm_ctl.down_many(NODES, "xid79 gpu fell off the bus") == ["node2", "node3"]
    reason = "Reason=recover: xid79 gpu fell off the bus"
    assert updates == [["scontrol", "update", "NodeName=node2,node3", "State=DOWN", reason]]
    ours = (True, False, "recover: xid79 gpu fell off the bus")
    assert states(slurm_ctl) == dict.fromkeys(NODES, ours)
    assert slurm_ctl.down_many(NODES, "xid79 gpu fell off the bus") == []  # holds: no-op
    assert len(updates) == 1


def test_drain_many_then_down_many_keep_another_owners_reason(
    slurm_ctl: CliSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm_ctl.run(["scontrol", "update", "NodeName=node1", "State=DRAIN", f"Reason={THEIRS}"])
    updates = count_updates(slurm_ctl, monkeypatch)
    assert slurm_ctl.drain_many(NODES, "xid48 ECC") == ["node2", "node3"]
    assert len(updates) == 1
    assert states(slurm_ctl) == {
        "node1": (False, True, THEIRS),
        "node2": (False, True, "recover: xid48 ECC"),
        "node3": (False, True, "recover: xid48 ECC"),
    }
    # DOWN for all three: theirs goes DOWN with their reason (one call per reason written).
    assert slurm_ctl.down_many(NODES, "xid48 ECC") == NODES
    assert sorted(u[2] for u in updates[1:]) == ["NodeName=node1", "NodeName=node2,node3"]
    assert states(slurm_ctl) == {
        "node1": (True, True, THEIRS),
        "node2": (True, True, "recover: xid48 ECC"),  # DOWN+DRAIN: Slurm keeps the flag
        "node3": (True, True, "recover: xid48 ECC"),
    }
    assert slurm_ctl.down_many(NODES, "xid48 ECC") == []
    assert len(updates) == 3
    assert slurm_ctl.node("node1").held_by_other


TRAPS_USR1 = """#!/bin/bash
trap 'echo got-usr1 >> "$OUT"; exit 0' USR1
echo started >> "$OUT"
for i in $(seq 1 600); do sleep 0.2 & wait $!; done
"""


def test_signal_job_reaches_the_batch_shell(slurm_ctl: CliSlurm, job_dir: Path) -> None:
    out = job_dir / "marks"
    job_id = slurm_ctl.submit(
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
    assert slurm_ctl.signal_job(job_id, "USR1") is True
    wait_for(lambda: "got-usr1" in out.read_text(), 10, "USR1 trapped by the batch shell")
    ended = wait_for(lambda: finished(slurm_ctl, job_id), 10, "job ended")
    assert ended.state == "COMPLETED"  # the trap's exit 0: the job was not killed
    assert slurm_ctl.signal_job(job_id, "USR1") is False  # finished: nothing to signal
    assert slurm_ctl.signal_job("999999", "USR1") is False  # never existed
