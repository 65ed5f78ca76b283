"""Flax NNX state through ``CheckpointManager``: a model's ``nnx.state`` and an
``nnx.Optimizer``'s, and ``nnx.split``'s state restored into an abstract model. The model
draws from its ``nnx.Rngs`` every step (typed keys and their counts are state too), so a
resumed run matches the uninterrupted one only if those come back bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax  # type: ignore[import-untyped]
import pytest
from flax import nnx

from recovery.api import CheckpointManager
from tests.api.helpers import is_keys, leaves_equal


class Noisy(nnx.Module):
    """A small regressor that uses every kind of NNX state: parameters, batch statistics,
    a dropout stream, and a stream of its own it draws input noise from."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(8, 1, rngs=rngs)
        self.rngs = rngs

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + 0.1 * jax.random.normal(self.rngs.noise(), x.shape)
        return self.out(self.drop(nnx.relu(self.norm(self.dense(x)))))


#: One optimizer transformation for every model: it is static in the optimizer's graph, so a
#: new one per model would compile the training step again for each.
ADAMW = optax.adamw(1e-2)


def make(seed: int) -> tuple[Noisy, nnx.Optimizer[Noisy]]:
    model = Noisy(nnx.Rngs(seed, dropout=seed + 1, noise=seed + 2))
    return model, nnx.Optimizer(model, ADAMW, wrt=nnx.Param)


@nnx.jit
def train_step(model: Noisy, optimizer: nnx.Optimizer[Noisy], step: jax.Array) -> jax.Array:
    # The batch depends on the step alone, so a resumed run sees the same data.
    x = jax.random.normal(jax.random.fold_in(jax.random.key(42), step), (16, 4))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def loss_fn(model: Noisy) -> jax.Array:
        return jnp.mean((model(x) - y) ** 2)

    loss: jax.Array
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def train(model: Noisy, optimizer: nnx.Optimizer[Noisy], start: int, stop: int) -> None:
    for step in range(start, stop):
        train_step(model, optimizer, jnp.int32(step))


def saved(model: Noisy, optimizer: nnx.Optimizer[Noisy]) -> dict[str, Any]:
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_model_and_optimizer_resume_bit_exactly(tmp_path: Path, async_save: bool) -> None:
    control = make(0)
    train(*control, 0, 6)

    model, optimizer = make(0)
    train(model, optimizer, 0, 3)
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        mgr.save(3, saved(model, optimizer))
        train(model, optimizer, 3, 4)  # goes on while the save runs
    # A new process: another seed's model and optimizer, then the checkpoint over them.
    model, optimizer = make(7)
    with CheckpointManager(tmp_path) as mgr:
        restored = mgr.restore(saved(model, optimizer))
    nnx.update(model, restored.state["model"])
    nnx.update(optimizer, restored.state["optimizer"])
    assert is_keys(model.rngs.noise.key[...])
    train(model, optimizer, 3, 6)
    assert leaves_equal(saved(model, optimizer), saved(*control))

    # The comparison can fail: the same run without the Rngs' restored counts differs.
    model, optimizer = make(7)
    nnx.update(model, restored.state["model"])
    nnx.update(optimizer, restored.state["optimizer"])
    model.rngs.noise.count[...] = jnp.uint32(0)
    train(model, optimizer, 3, 6)
    assert not leaves_equal(saved(model, optimizer), saved(*control))


@pytest.mark.slow
def test_split_state_restores_into_an_abstract_model(tmp_path: Path) -> None:
    model, optimizer = make(0)
    train(model, optimizer, 0, 2)
    graphdef, state = nnx.split(model)
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(2, state)
        # nnx.eval_shape allocates nothing: its state holds jax.ShapeDtypeStruct leaves,
        # typed keys' among them.
        abstract = nnx.state(nnx.eval_shape(lambda: make(5)[0]))
        kinds = {x.dtype for x in jax.tree.leaves(abstract)}
        assert any(jnp.issubdtype(d, jax.dtypes.prng_key) for d in kinds)
        restored = mgr.restore(abstract)
    again = nnx.merge(graphdef, restored.state)
    assert leaves_equal(nnx.state(again), state)
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    assert jnp.array_equal(again(x), model(x))  # draws the same noise and dropout masks
