"""Real training state through the manager: a Flax TrainState with an Optax chain, a
``flax.struct`` dataclass with a static field, custom pytree nodes, and bf16/fp16/int8/uint8/
bool/int16 leaves, each saved synchronously and asynchronously and restored bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recovery.api import CheckpointManager
from tests.api.helpers import (
    Ema,
    KeyedPair,
    Plain,
    dtype_leaves,
    leaves_equal,
    make_train_state,
    train,
)

MODES = pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])


@pytest.mark.slow
@MODES
def test_flax_train_state_resumes_bit_exactly(tmp_path: Path, async_save: bool) -> None:
    uninterrupted = train(make_train_state(), 0, 12)

    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        state = train(make_train_state(), 0, 7)
        mgr.save(7, state)
        # the caller keeps training while the save runs; jit may reuse buffers meanwhile
        train(state, 7, 9)
    with CheckpointManager(tmp_path) as mgr:
        # a template that allocates nothing: the shapes of a freshly initialised state
        template = jax.eval_shape(lambda: train(make_train_state(), 0, 1))
        restored = mgr.restore(template)
    assert restored.step == 7
    assert leaves_equal(restored.state, state)
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(restored.state))
    resumed = train(restored.state, 7, 12)
    assert leaves_equal(resumed, uninterrupted)
    assert not leaves_equal(train(restored.state, 7, 11), uninterrupted)  # the check can fail
    # Optax's named tuples and the chain's positions are in the saved paths
    paths = set(CheckpointManager(tmp_path, read_only=True).restore_arrays().state)
    assert {"step", "opt_state/1/0/count", "opt_state/1/0/mu/params/Dense_0/kernel"} <= paths


def test_fresh_train_state_as_template_gets_a_python_int_step(tmp_path: Path) -> None:
    # TrainState.create starts `step` at the int 0; the saved step is an int32 array.
    trained = train(make_train_state(), 0, 3)
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(3, trained)
        restored = mgr.restore(make_train_state(seed=1)).state
    assert type(restored.step) is int
    assert restored.step == 3
    assert leaves_equal(restored.params, trained.params)
    assert leaves_equal(restored.opt_state, trained.opt_state)


@MODES
def test_struct_dataclass_and_custom_nodes(tmp_path: Path, async_save: bool) -> None:
    def make(seed: int) -> dict[str, Any]:
        k = jax.random.PRNGKey(seed)
        return {
            "ema": Ema(mean=jax.random.normal(k, (3,)), count=jnp.int32(seed), decay=0.9),
            "pair": KeyedPair(jnp.full(2, seed, jnp.int16), Plain(jnp.ones(1) * seed, seed)),
        }

    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        mgr.save(1, make(5))
    with CheckpointManager(tmp_path, read_only=True) as mgr:
        restored = mgr.restore(make(0)).state
        paths = sorted(mgr.restore_arrays().state)
    assert leaves_equal(restored, make(5))
    assert restored["ema"].decay == 0.9  # static: from the template, not a leaf
    assert paths == ["ema/count", "ema/mean", "pair/left", "pair/right/0", "pair/right/1"]


@MODES
def test_every_dtype_round_trips_bit_for_bit(tmp_path: Path, async_save: bool) -> None:
    saved = dtype_leaves(seed=3)
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        mgr.save(2, saved)
    restored = CheckpointManager(tmp_path, read_only=True).restore(dtype_leaves(seed=4)).state
    assert leaves_equal(restored, saved)
    assert not leaves_equal(dtype_leaves(seed=4), saved)
    assert restored["bf16"].dtype == jnp.bfloat16
    assert isinstance(restored["bf16"], jax.Array)
    assert isinstance(restored["np_f64"], np.ndarray)  # a numpy leaf stays numpy
    arrays = CheckpointManager(tmp_path, read_only=True).restore_arrays().state
    assert {k: str(v.dtype) for k, v in arrays.items()} == {
        "bf16": "bfloat16", "bool": "bool", "empty": "float32", "f16": "float16",
        "f32": "float32", "i16": "int16", "i32": "int32", "i8": "int8", "np_f64": "float64",
        "scalar": "float32", "u32_key": "uint32", "u8": "uint8",
    }  # fmt: skip
