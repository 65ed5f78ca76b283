"""The memory tier (``recovery.api.memory``) takes what a user's state holds, as the
checkpoints do: typed PRNG keys and Python numbers come back bit for bit, and a leaf it cannot
hold is refused with a UsageError naming it. One process; the group's collective is a
stand-in that answers for that one process (the real, several-process path is
tests/train/test_memory_tier.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recovery.api.memory import FromMemory, MemoryTier, restore_from_memory
from recovery.errors import UsageError


class OneProcess:
    """What restore_from_memory asks of a group, for a group of one."""

    rank = 0

    def allgather(self, value: Any, *, channel: str) -> list[Any]:
        return [value]


#: Typed as Any: restore_from_memory names the real Group, of which this answers the part it uses.
ONE: Any = OneProcess()


def state(seed: int) -> dict[str, Any]:
    return {
        "w": jnp.arange(6.0).reshape(2, 3) * seed,
        "key": jax.random.key(seed),
        "keys": jax.random.split(jax.random.key(seed + 1), 3),
        "step": seed,
    }


def test_typed_keys_and_numbers_come_back_bit_for_bit(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, every=1, run_config={"model": "m"}, processes=1)
    assert tier.copy(7, state(7))
    got = restore_from_memory(
        ONE,
        state(0),
        tier,
        newest_durable=-1,
        node="n1",
        log=print,
    )
    assert isinstance(got, FromMemory), got
    assert got.step == 7
    want = state(7)
    for name in ("key", "keys"):
        assert jax.random.key_impl(got.state[name]) == jax.random.key_impl(want[name])
        np.testing.assert_array_equal(
            jax.random.key_data(got.state[name]), jax.random.key_data(want[name])
        )
    np.testing.assert_array_equal(got.state["w"], want["w"])
    assert got.state["step"] == 7
    assert type(got.state["step"]) is int
    # The check can fail: the template's own keys differ from the copy's.
    assert not np.array_equal(
        jax.random.key_data(state(0)["key"]), jax.random.key_data(got.state["key"])
    )


def test_keys_of_another_size_are_refused_not_misread(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, every=1, run_config={"model": "m"}, processes=1)
    assert tier.copy(3, state(3))
    template = {**state(0), "key": jax.random.key(0, impl="rbg")}  # 4 words, not threefry's 2
    got = restore_from_memory(
        ONE,
        template,
        tier,
        newest_durable=-1,
        node="n1",
        log=print,
    )
    assert isinstance(got, str)
    assert "did not match its digest" in got


def test_a_leaf_it_cannot_hold_is_refused_naming_it(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, every=1, run_config={"model": "m"}, processes=1)
    with pytest.raises(UsageError, match="leaf 'note' is a str"):
        tier.copy(1, {"w": jnp.ones(2), "note": "adam"})
    assert tier.copies == 0
