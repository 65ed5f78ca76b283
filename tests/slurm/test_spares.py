"""The spare pool on the real cluster, per backend: promote, run out, retire, refuse others'
nodes."""

from __future__ import annotations

import pytest

from recovery.errors import NoSpareError, ReasonNotOursError
from recovery.pool.spares import SPARE_REASON, SparePool
from recovery.ports.slurm import SlurmControl
from slurm.cli_slurm import CliSlurm
from tests.slurm.helpers import wait_for

pytestmark = pytest.mark.slurm


@pytest.mark.writes("resume", "drain")
def test_promote_until_empty_then_retire_back(slurm_backend: SlurmControl) -> None:
    pool = SparePool(slurm_backend)
    assert [n.name for n in pool.spares()] == ["spare1"]
    assert pool.promote() == "spare1"
    wait_for(lambda: slurm_backend.node("spare1").in_service, 10, "spare1 in service")
    assert pool.spares() == []
    with pytest.raises(NoSpareError, match="no spare left in the pool"):
        pool.promote()
    assert pool.retire("spare1") is True
    spare = slurm_backend.node("spare1")
    assert spare.drained
    assert spare.reason == SPARE_REASON
    assert pool.retire("spare1") is False  # already a spare: no-op


@pytest.mark.writes("down", "drain", "resume")
def test_a_node_we_set_down_retires_into_the_pool_without_serving(
    slurm_backend: SlurmControl,
) -> None:
    pool = SparePool(slurm_backend)
    assert slurm_backend.down("node2", "xid79 gpu fell off the bus") is True
    assert pool.retire("node2") is True  # repaired: back into the pool, never into service
    node = slurm_backend.node("node2")
    assert (node.state, node.reason) == ("IDLE", SPARE_REASON)
    assert node.drained  # and NOT_RESPONDING until slurmctld's ping: no job can land on it
    wait_for(lambda: len(pool.spares()) == 2, 10, "node2 a ready spare")
    assert [n.name for n in pool.spares()] == ["node2", "spare1"]
    assert pool.promote() == "node2"  # first by name


def test_retire_refuses_a_node_someone_else_holds(
    slurm_backend: SlurmControl, slurm_ctl: CliSlurm
) -> None:
    slurm_ctl.run(["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=rma (bob)"])
    with pytest.raises(ReasonNotOursError, match="'rma \\(bob\\)' set by root"):
        SparePool(slurm_backend).retire("node3")
    assert slurm_backend.node("node3").reason == "rma (bob)"
