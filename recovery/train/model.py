"""A small but real JAX model: an MLP classifier trained with Adam on a synthetic task.

Everything that affects the trajectory is a pure function of the run configuration (seed,
learning rate, model preset) and of the state, and the batch for data position ``p`` is a
pure function of ``(seed, p)``; that is what makes a resumed run bit-identical to an
uninterrupted one. The state is sharded over the devices of one process (mesh axis
``data``): batches along their leading dimension, weights along their output dimension where
it divides evenly. With several processes (data parallel, mesh axes ``proc`` x ``data``) the
state is replicated on every process and each process computes its slice of the global
batch; the global batch at a position does not depend on the process count, and the loss is
its mean, so gradients are averaged over all processes.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from recovery.errors import UsageError, unknown_choice

State = dict[str, Any]
Batch = tuple[jax.Array, jax.Array]


@dataclass(frozen=True)
class ModelSpec:
    """Sizes of one preset. State bytes ~= 3 (params, Adam m, Adam v) x 4 x parameters."""

    in_dim: int
    """Input features per example."""
    width: int
    """Hidden units per layer."""
    depth: int
    """Hidden layers (>= 1)."""
    classes: int
    """Output classes."""
    batch_size: int
    """Examples per step (global, split over devices)."""
    dropout: float
    """Dropout rate on hidden activations; consumes the state's PRNG key every step."""

    def parameter_count(self) -> int:
        dims = [self.in_dim] + [self.width] * self.depth + [self.classes]
        return sum(a * b + b for a, b in itertools.pairwise(dims))


MODELS: dict[str, ModelSpec] = {
    # tests and the demo: compiles in well under a second
    "mlp-tiny": ModelSpec(in_dim=16, width=32, depth=2, classes=4, batch_size=32, dropout=0.1),
    # mlp-tiny with a batch that divides over 2, 3 and 4 processes (and 6, 8, 12, ...)
    "mlp-tiny-48": ModelSpec(in_dim=16, width=32, depth=2, classes=4, batch_size=48, dropout=0.1),
    "mlp-small": ModelSpec(in_dim=64, width=256, depth=3, classes=10, batch_size=64, dropout=0.1),
    # ~50 MB of state
    "mlp-medium": ModelSpec(
        in_dim=256, width=1024, depth=4, classes=16, batch_size=64, dropout=0.1
    ),
    # ~1.1 GB of state, for checkpoint benchmarks
    "mlp-1g": ModelSpec(in_dim=1024, width=4096, depth=6, classes=64, batch_size=32, dropout=0.1),
}


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise unknown_choice("model", name, MODELS)
    return MODELS[name]


def run_config(*, model: str, seed: int, lr: float) -> dict[str, Any]:
    """Everything that determines the trajectory; checkpoints record it and restore checks it.

    The step count and save interval are deliberately absent: extending a run to more steps
    or saving more often continues the same trajectory.
    """
    if not (lr > 0 and np.isfinite(lr)):
        raise UsageError(f"--lr must be a positive finite number (got {lr})")
    return {"model": model, **asdict(get_spec(model)), "seed": seed, "lr": lr, "optimizer": "adam"}


def make_mesh(processes: int = 1) -> Mesh:
    """One process: every device on axis ``data``. Several (after ``jax.distributed`` joined
    them): axes ``proc`` (one row per process, in process order) x ``data`` (its devices)."""
    if processes == 1:
        return Mesh(np.array(jax.devices()), ("data",))
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices).reshape(processes, -1), ("proc", "data"))


def _local_size(mesh: Mesh) -> int:
    """Devices of one process: the state is sharded over these only."""
    return int(mesh.shape["data"])


def _layer_dims(spec: ModelSpec) -> list[tuple[int, int]]:
    dims = [spec.in_dim] + [spec.width] * spec.depth + [spec.classes]
    return list(itertools.pairwise(dims))


def state_shardings(spec: ModelSpec, mesh: Mesh) -> State:
    """Sharding of every state leaf (same tree structure as :func:`init_state`'s result)."""
    n = _local_size(mesh)
    rep = NamedSharding(mesh, P())

    def layer(d_in: int, d_out: int) -> dict[str, NamedSharding]:
        split = d_out % n == 0
        return {
            "w": NamedSharding(mesh, P(None, "data") if split else P()),
            "b": NamedSharding(mesh, P("data") if split else P()),
        }

    params = {"layers": [layer(a, b) for a, b in _layer_dims(spec)]}
    return {
        "params": params,
        "opt": {"m": params, "v": params, "count": rep},
        "rng": rep,
        "step": rep,
    }


def batch_sharding(spec: ModelSpec, mesh: Mesh) -> tuple[NamedSharding, NamedSharding]:
    """Raises UsageError when the batch does not divide over every device of the job."""
    n = mesh.devices.size
    if spec.batch_size % n:
        where = f"{n} devices"
        if "proc" in mesh.axis_names:
            where = f"{mesh.shape['proc']} processes x {_local_size(mesh)} device(s) each"
        fits = sorted(name for name, s in MODELS.items() if s.batch_size % n == 0)
        raise UsageError(
            f"batch size {spec.batch_size} of this model does not divide over {where}; "
            f"models whose batch does: {', '.join(fits) or 'none'}"
        )
    axis: str | tuple[str, ...] = ("proc", "data") if "proc" in mesh.axis_names else "data"
    return NamedSharding(mesh, P(axis, None)), NamedSharding(mesh, P(axis))


def _keys(seed: int) -> jax.Array:
    # One root key per run, split into: parameter init, the state's dropout key, data, teacher.
    return jax.random.split(jax.random.PRNGKey(seed), 4)


@functools.cache
def make_init(spec: ModelSpec, mesh: Mesh, seed: int) -> Callable[[], State]:
    """A jitted function returning the initial state, placed with :func:`state_shardings`.

    The ``make_*`` functions are cached by their (hashable) arguments so that several runs in
    one process share compiled code.
    """

    def init() -> State:
        k_init, k_rng, _, _ = _keys(seed)
        layers = []
        for i, (d_in, d_out) in enumerate(_layer_dims(spec)):
            k = jax.random.fold_in(k_init, i)
            w = jax.random.normal(k, (d_in, d_out), jnp.float32) * jnp.sqrt(2.0 / d_in)
            layers.append({"w": w, "b": jnp.zeros((d_out,), jnp.float32)})
        params = {"layers": layers}
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {
            "params": params,
            "opt": {"m": zeros, "v": zeros, "count": jnp.zeros((), jnp.int32)},
            "rng": k_rng,
            "step": jnp.zeros((), jnp.int32),
        }

    return jax.jit(init, out_shardings=state_shardings(spec, mesh))


@functools.cache
def make_batch_fn(spec: ModelSpec, mesh: Mesh, seed: int) -> Callable[[jax.Array], Batch]:
    """Jitted ``position -> (x, y)``: the batch at a data position, a pure function of it."""

    def batch(position: jax.Array) -> Batch:
        _, _, k_data, _ = _keys(seed)
        return _examples(spec, seed, jax.random.fold_in(k_data, position))

    return jax.jit(batch, out_shardings=batch_sharding(spec, mesh))


def _examples(spec: ModelSpec, seed: int, key: jax.Array) -> Batch:
    """A batch of inputs drawn with ``key``, labelled by the run's fixed teacher."""
    _, _, _, k_teacher = _keys(seed)
    teacher = jax.random.normal(k_teacher, (spec.in_dim, spec.classes), jnp.float32)
    x = jax.random.normal(key, (spec.batch_size, spec.in_dim), jnp.float32)
    y = jnp.argmax(x @ teacher, axis=-1).astype(jnp.int32)
    return x, y


def _loss(spec: ModelSpec, params: State, batch: Batch, key: jax.Array) -> jax.Array:
    """Mean cross-entropy of ``params`` on ``batch`` (``key``: the dropout's)."""
    x, y = batch
    logp = jax.nn.log_softmax(_forward(spec, params, x, key))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))


@functools.cache
def make_held_out_loss(spec: ModelSpec, seed: int) -> Callable[[State], jax.Array]:
    """Jitted ``params -> loss`` on the run's held-out batch (drawn from a stream no training
    step reads; the same batch every time, so the losses compare), without dropout.
    ``params`` are host arrays (this process's own copy,
    :func:`recovery.checkpoint.tree.to_host`): it runs on this process's first device alone,
    with no collective, so one process can evaluate while the others wait for it."""
    _, _, k_data, _ = _keys(seed)
    held_out = jax.random.split(k_data)[1]
    plain = replace(spec, dropout=0.0)

    def loss(params: State) -> jax.Array:
        return _loss(plain, params, _examples(spec, seed, held_out), held_out)

    return jax.jit(loss)


def _forward(spec: ModelSpec, params: State, x: jax.Array, key: jax.Array) -> jax.Array:
    h = x
    layers = params["layers"]
    for i, layer in enumerate(layers[:-1]):
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
        if spec.dropout > 0:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - spec.dropout, h.shape)
            h = jnp.where(keep, h / (1.0 - spec.dropout), 0.0)
    return h @ layers[-1]["w"] + layers[-1]["b"]


def adam_update(state: State, grads: State, rng: jax.Array, lr: float) -> State:
    """The state after one Adam update with ``grads`` (``rng``: the state's next key)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    count = state["opt"]["count"] + 1
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["opt"]["m"], grads)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["opt"]["v"], grads)
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** count.astype(jnp.float32)
    params = jax.tree_util.tree_map(
        lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), state["params"], m, v
    )
    return {
        "params": params,
        "opt": {"m": m, "v": v, "count": count},
        "rng": rng,
        "step": state["step"] + 1,
    }


def loss(spec: ModelSpec, params: State, batch: Batch, key: jax.Array) -> jax.Array:
    """Mean cross-entropy of ``params`` on ``batch``, ``key`` the dropout's (traceable)."""
    return _loss(spec, params, batch, key)


@functools.cache
def make_train_step(
    spec: ModelSpec, mesh: Mesh, lr: float
) -> Callable[[State, Batch], tuple[State, jax.Array]]:
    """Jitted ``(state, batch) -> (state, loss)``: one Adam update. Inputs are not donated, so
    a state handed to an asynchronous save stays valid. (Several processes take the step in
    two programs instead: :mod:`recovery.train.split_step`.)"""

    def step(state: State, batch: Batch) -> tuple[State, jax.Array]:
        rng, k_drop = jax.random.split(state["rng"])
        value, grads = jax.value_and_grad(lambda p: _loss(spec, p, batch, k_drop))(state["params"])
        return adam_update(state, grads, rng, lr), value

    shard = state_shardings(spec, mesh)
    rep = NamedSharding(mesh, P())
    return jax.jit(
        step,
        in_shardings=(shard, batch_sharding(spec, mesh)),
        out_shardings=(shard, rep),
    )
