"""The memory tier with real processes (``--memory-every``): a relaunch takes its state from
a surviving node's memory, a process on a node that never trained finds nothing of another
node's, a damaged copy falls back (older copy, then the durable checkpoint) and says why, and
every path ends on the uninterrupted run's digest.

The processes run on this machine; each is told its node (``SLURMD_NODENAME``) as srun
would, so each has its own node-local directory, as the nodes of the local cluster do.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest

from recovery.api.memory import (
    BUDGET,
    KEEP,
    MemoryTier,
    local_dir,
    newest_local,
    read_run_id,
    read_slot,
)
from recovery.checkpoint import CheckpointStore
from recovery.checkpoint.format import arrays_digest
from recovery.multiproc import EXIT_PEER_LOST
from tests.train.conftest import wait_for
from tests.train.multi import STOP_WITHIN_S, final_digest, launch, of

STEPS = 12  # tests.train.conftest.K2_STEPS


@pytest.fixture(scope="module")
def control(k2_control: tuple[int, str]) -> str:
    assert k2_control[0] == STEPS
    return k2_control[1]


def _slot_steps(directory: Path) -> list[int]:
    """The steps of the slots in ``directory`` (their headers, unchecked)."""
    steps = []
    for slot in directory.glob("slot-*.bin"):
        raw = slot.read_bytes()
        size = int.from_bytes(raw[8:16], "little")
        steps.append(int(json.loads(raw[16 : 16 + size])["step"]))
    return steps


def _nodes(*names: str) -> list[dict[str, str]]:
    # No cluster: each node's copies under its bare name (recovery.contract.memplace.node_key),
    # whatever SLURM_CONF this test process carries (the pyslurm adapter exports one).
    return [{"SLURMD_NODENAME": n, "SLURM_CONF": ""} for n in names]


def _crash(run_dir: Path, root: Path, cache: Path, *, at_step: int) -> int:
    """Train on n1 and n2 (a copy every step, no durable checkpoint before the end), SIGABRT
    process 1 once process 0 has kept a copy of ``at_step``: the newest step process 0 reached."""
    job = launch(
        run_dir, 2, STEPS, 100, "--step-sleep", "0.2", "--compile-cache", str(cache),
        env={"RECOVER_MEMORY_EVERY": "1", "RECOVER_MEMORY_DIR": str(root)},
        rank_env=_nodes("n1", "n2"),
    )  # fmt: skip
    try:
        n1 = local_dir(root, "n1", run_dir, "x").parent

        def kept() -> bool:
            return any(
                max(_slot_steps(d), default=-1) >= at_step for d in n1.glob("*") if d.is_dir()
            )

        wait_for(kept, what=f"a copy of step {at_step} on n1", timeout=240)
        job.signal(1, signal.SIGABRT)
        codes = job.wait(STOP_WITHIN_S)
    finally:
        job.kill()
    assert codes == [EXIT_PEER_LOST, -signal.SIGABRT], job.errors()
    assert not CheckpointStore(run_dir / "checkpoints").steps()  # only memory holds progress
    return int(max(e["step"] for e in of(run_dir, "step")[0]))


def _relaunch(run_dir: Path, root: Path, cache: Path, *nodes: str) -> None:
    job = launch(
        run_dir, 2, STEPS, 100, "--auto-resume", "--compile-cache", str(cache),
        env={"RECOVER_MEMORY_EVERY": "1", "RECOVER_MEMORY_DIR": str(root)},
        rank_env=_nodes(*nodes),
    )  # fmt: skip
    assert job.wait() == [0, 0], job.errors()


@pytest.mark.slow
def test_a_relaunch_takes_the_state_from_the_survivors_memory(
    tmp_path: Path, cache: Path, control: str
) -> None:
    """n2's process dies; the relaunch runs on n1 (the survivor) and n3 (a spare that never
    trained). Both restore n1's newest copy, n3's process received it (it had nothing of its
    own), at most one step is computed again, and the run ends on the control's digest."""
    run_dir, root = tmp_path / "run", tmp_path / "shm"
    reached = _crash(run_dir, root, cache, at_step=5)
    rid = read_run_id(run_dir)
    assert not local_dir(root, "n3", run_dir, rid).exists()

    _relaunch(run_dir, root, cache, "n1", "n3")
    restored = {r: [e for e in ev if e.get("source")] for r, ev in of(run_dir, "restored").items()}
    (r0,), (r1,) = restored[0], restored[1]
    assert r0["source"] == r1["source"] == "memory"
    assert r0["from_node"] == r1["from_node"] == "n1"
    assert r0["from_rank"] == 0
    assert r0["local_step"] == r0["step"]
    assert r1["local_step"] == -1  # n3 had nothing: the state came from n1
    assert r0["state_digest"] == r1["state_digest"]
    assert reached - r0["step"] <= 1
    assert final_digest(run_dir, 2) == control
    # Completed: the copies are gone from every node the run used.
    assert not any(local_dir(root, n, run_dir, rid).exists() for n in ("n1", "n3"))


@pytest.mark.slow
def test_a_process_never_reads_another_nodes_copy(
    tmp_path: Path, cache: Path, control: str
) -> None:
    """n1 and n2 both hold copies; a relaunch on n3 and n4 finds none (each node has only its
    own directory), says why, and starts over from the durable state (none: from scratch)."""
    run_dir, root = tmp_path / "run", tmp_path / "shm"
    _crash(run_dir, root, cache, at_step=4)
    rid = read_run_id(run_dir)
    assert _slot_steps(local_dir(root, "n1", run_dir, rid))
    assert _slot_steps(local_dir(root, "n2", run_dir, rid))

    _relaunch(run_dir, root, cache, "n3", "n4")
    fell = of(run_dir, "memory-fallback")
    assert [e["reason"] for e in fell[0]] == ["no node holds a copy of the state in memory"]
    assert not [e for e in of(run_dir, "restored").get(0, []) if e.get("source") == "memory"]
    assert final_digest(run_dir, 2) == control


@pytest.mark.slow
def test_damaged_copies_fall_back_older_then_durable_and_say_why(
    tmp_path: Path, cache: Path, control: str
) -> None:
    """Every copy on the survivor damaged: each is refused by its digest (logged), the
    relaunch falls back to the durable state, says why, and ends on the control's digest."""
    run_dir, root = tmp_path / "run", tmp_path / "shm"
    _crash(run_dir, root, cache, at_step=KEEP + 2)
    rid = read_run_id(run_dir)
    n1 = local_dir(root, "n1", run_dir, rid)
    slots = sorted(n1.glob("slot-*.bin"))
    assert len(slots) == KEEP
    for slot in slots:
        raw = bytearray(slot.read_bytes())
        raw[-3] ^= 0xFF  # in the last leaf's bytes
        slot.write_bytes(bytes(raw))

    _relaunch(run_dir, root, cache, "n1", "n3")
    (fell,) = of(run_dir, "memory-fallback")[0]
    assert fell["reason"] == "no node holds a copy of the state in memory"
    log = (tmp_path / "run.rank0.log").read_text()
    for slot in slots:
        assert f"local copy {slot.name} is not usable: step " in log
    assert log.count("does not match its digest") >= KEEP
    assert final_digest(run_dir, 2) == control


def test_an_in_memory_digest_equals_the_checkpoints(tmp_path: Path) -> None:
    """What a receiving process checks: the digest of arrays in memory equals the digest of
    their checkpoint (scalars, -0.0 and a non-contiguous leaf included)."""
    arrays = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2] * -0.0,
        "step": np.array(7, dtype=np.int32),
        "b": np.linspace(0, 1, 5),
    }
    saved = CheckpointStore(tmp_path).save(1, arrays, run_config={})
    assert arrays_digest(arrays) == saved.state_digest
    arrays["b"] = arrays["b"].copy()
    arrays["b"][0] = 1e-9
    assert arrays_digest(arrays) != saved.state_digest


def test_the_tier_keeps_to_its_share_of_the_wall_time(tmp_path: Path) -> None:
    """A copy that took c seconds delays the next by c / BUDGET; a copy not due is skipped,
    never waited for. The first copy delays nothing (it pays one-off costs)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.01  # every reading 10 ms later: a copy "takes" 10 ms
        return now[0]

    tier = MemoryTier(tmp_path / "m", every=1, run_config={}, processes=2, clock=clock)
    state = {"w": np.ones(4, dtype=np.float32)}
    assert tier.offer(1, state)
    assert tier.offer(2, state)  # the first copy's cost is not held against the next
    assert not tier.offer(3, state)  # due again 0.01 / BUDGET seconds after copy 2 began
    copied = [step for step in range(4, 200) if tier.offer(step, state)]
    assert copied
    assert copied[0] >= 0.01 / BUDGET / 0.01 - 2
    assert tier.copies == 2 + len(copied)
    assert tier.spent_s == pytest.approx(0.01 * tier.copies)


def test_a_slot_names_why_it_cannot_be_used(tmp_path: Path) -> None:
    """The two slots are written in turn; a damaged, cut or foreign one is refused naming
    why, and the other one still restores."""
    tier = MemoryTier(tmp_path / "m", every=1, run_config={"model": "a"}, processes=2)
    tier._clock = lambda: 0.0  # no budget: copy every time
    for step in (1, 2, 3):
        assert tier.offer(step, {"w": np.full(8, step, dtype=np.float32)})
    held = newest_local(tier)
    assert held.step == 3
    assert held.arrays is not None
    assert held.arrays["w"].tolist() == [3.0] * 8
    newest = next(p for p in tier.slots() if read_slot(p, config_id=tier.config_id,
                                                       processes=2)[0] == 3)  # fmt: skip
    raw = bytearray(newest.read_bytes())
    raw[-5] ^= 0xFF
    newest.write_bytes(bytes(raw))
    held = newest_local(tier)
    assert held.step == 2
    assert held.refused == [(newest.name, "step 3: leaf w does not match its digest")]
    newest.write_bytes(bytes(raw[:100]))
    assert "cut short" in newest_local(tier).refused[0][1]
    other = MemoryTier(tmp_path / "m", every=1, run_config={"model": "b"}, processes=2)
    assert newest_local(other).step == -1
    assert "another run configuration" in newest_local(other).refused[-1][1]
    assert (
        "run of 2 processes"
        in newest_local(
            MemoryTier(tmp_path / "m", every=1, run_config={"model": "a"}, processes=4)
        ).refused[-1][1]
    )


def test_with_the_vote_one_step_late_cheap_copies_still_come_every_step(tmp_path: Path) -> None:
    """The loop asks process 0 before a step and every process copies one step later (the
    stop vote's lag): a copy far below the budget follows every step, not every other one
    (2 steps redone after a fault instead of at most 1)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # a copy "takes" 1 ms, steps (readings apart) are 0.5 s below
        return now[0]

    tier = MemoryTier(tmp_path / "m", every=1, run_config={}, processes=2, clock=clock)
    state = {"w": np.ones(4, dtype=np.float32)}
    asked = False
    copied = []
    for step in range(1, 21):
        wish = tier.due(step)
        now[0] += 0.5  # the step
        if asked:
            tier.copy(step, state)
            copied.append(step)
        asked = wish
    assert copied == list(range(2, 21))
