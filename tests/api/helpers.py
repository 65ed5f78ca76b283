# Flax leaves much of its API unannotated (TrainState.create, flax.struct.field).
# mypy: disable-error-code="no-untyped-call"
"""Real training states for the API's tests: a Flax TrainState with an Optax chain, a
``flax.struct`` dataclass with a static field, custom pytree nodes, and leaves of many dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]
from flax.training import train_state


class Mlp(nn.Module):
    """Two dense layers: small, but a real Flax module with nested parameter dicts."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(16)(x))
        return nn.Dense(4)(x)


def make_train_state(seed: int = 0) -> train_state.TrainState:
    """A fresh TrainState: Adam inside an Optax chain (named-tuple states), ``step`` the int 0."""
    model = Mlp()
    params = model.init(jax.random.PRNGKey(seed), jnp.ones((1, 8)))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)  # type: ignore[no-any-return]


def _loss(params: Any, state: train_state.TrainState, x: jax.Array, y: jax.Array) -> jax.Array:
    pred = state.apply_fn(params, x)
    return jnp.mean((pred - y) ** 2)


@jax.jit
def train_step(state: train_state.TrainState, step: jax.Array) -> train_state.TrainState:
    """One update on a batch that depends only on ``step`` (so a resumed run sees the same)."""
    key = jax.random.fold_in(jax.random.PRNGKey(42), step)
    x = jax.random.normal(key, (32, 8))
    y = jnp.tanh(x[:, :4])
    grads = jax.grad(_loss)(state.params, state, x, y)
    return state.apply_gradients(grads=grads)  # type: ignore[no-any-return]


def train(state: train_state.TrainState, start: int, stop: int) -> train_state.TrainState:
    for step in range(start, stop):
        state = train_step(state, jnp.int32(step))
    return state


@flax.struct.dataclass
class Ema:
    """A ``flax.struct`` dataclass: ``decay`` is static (in the tree's structure, not a leaf)."""

    mean: jax.Array
    count: jax.Array
    decay: float = flax.struct.field(pytree_node=False, default=0.99)


@jax.tree_util.register_pytree_with_keys_class
@dataclass
class KeyedPair:
    """A custom pytree node that names its children (paths ``.../left``, ``.../right``)."""

    left: Any
    right: Any

    def tree_flatten_with_keys(self) -> tuple[Any, None]:
        k = jax.tree_util.GetAttrKey
        return ((k("left"), self.left), (k("right"), self.right)), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Any) -> KeyedPair:
        return cls(*children)


class Plain:
    """A custom pytree node registered without keys (paths by position)."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


jax.tree_util.register_pytree_node(
    Plain, lambda p: ((p.a, p.b), None), lambda _, children: Plain(*children)
)


def dtype_leaves(seed: int = 0) -> dict[str, Any]:
    """One leaf of each dtype a training state holds, with values that use every bit pattern
    a sloppy conversion would lose (NaN payloads aside): negatives, extremes, fractions."""
    rng = np.random.default_rng(seed)
    return {
        "bf16": jnp.asarray(rng.standard_normal((3, 5)) * 1e3, dtype=jnp.bfloat16),
        "f16": jnp.asarray(rng.standard_normal(7) * 1e-3, dtype=jnp.float16),
        "f32": jnp.asarray(rng.standard_normal((2, 2)), dtype=jnp.float32),
        "i8": jnp.asarray([-128, -1, 0, 1, 127], dtype=jnp.int8),
        "u8": jnp.asarray([0, 1, 128, 255], dtype=jnp.uint8),
        "i16": jnp.asarray([-32768, -7, 0, 32767], dtype=jnp.int16),
        "i32": jnp.asarray(rng.integers(-(2**31), 2**31 - 1, 6), dtype=jnp.int32),
        "bool": jnp.asarray([True, False, True]),
        "u32_key": jax.random.PRNGKey(seed),
        "np_f64": rng.standard_normal(3),
        "empty": jnp.zeros((0, 4), jnp.float32),
        "scalar": jnp.float32(3.5),
    }


def is_keys(x: Any) -> bool:
    """Whether ``x`` is an array of typed PRNG keys (``jax.random.key``)."""
    return isinstance(x, jax.Array) and bool(jnp.issubdtype(x.dtype, jax.dtypes.prng_key))


def leaves_equal(a: Any, b: Any) -> bool:
    """The same leaf paths, and every leaf the same dtype, shape and bytes (a Python number
    the same type and value; typed PRNG keys the same key type and key data). Static fields
    are not compared: two TrainStates made by two calls hold two different (equivalent)
    Optax functions."""
    la = jax.tree_util.tree_flatten_with_path(a)[0]
    lb = jax.tree_util.tree_flatten_with_path(b)[0]
    if [p for p, _ in la] != [p for p, _ in lb]:
        return False
    for (_, x), (_, y) in zip(la, lb, strict=True):
        if type(x) in (bool, int, float) or type(y) in (bool, int, float):
            if type(x) is not type(y) or x != y:
                return False
            continue
        if is_keys(x) or is_keys(y):
            if not (is_keys(x) and is_keys(y)) or x.dtype != y.dtype:
                return False
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        nx, ny = np.asarray(x), np.asarray(y)
        if nx.dtype != ny.dtype or nx.shape != ny.shape or nx.tobytes() != ny.tobytes():
            return False
    return True
