"""The train step of several processes as two programs, so that each process can time its
own share of a step apart from its wait for the others: what the straggler rule compares
(:mod:`recovery.progress.straggler`: a slow node's process takes longer over its share,
while every process's step takes as long as the slowest's).

* ``partial(state, batch) -> (losses, grads)``: each process's loss and gradients on its own
  rows of the batch, stacked on a leading ``proc`` axis sharded over the processes. No
  collective: a process computes its row from its examples and the parameters it holds, so
  waiting for this program's local result is waiting for this process's own work.
* ``apply(state, losses, grads) -> (state, loss)``: the mean over the processes (the
  collective, where the others wait for the slowest) and the Adam update.

The mean of the rows' mean losses is the batch's mean loss (the rows are equal in size), and
the mean of their gradients its gradient; each row's dropout is drawn with the step's key
folded with the row's index. The numbers are not bit for bit those of the one-program step
(the sums run in another order), so a run keeps to one of the two: several processes always
take this one (:func:`recovery.train.loop`), a single process the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from recovery.train import model as M


class SplitStep(NamedTuple):
    partial: Callable[[Any, Any], tuple[Any, Any]]
    """``(state, batch) -> (losses, grads)``: this process's own work, no collective."""
    apply: Callable[[Any, Any, Any], tuple[Any, Any]]
    """``(state, losses, grads) -> (state, loss)``: the mean across processes, the update."""


def _stacked(mesh: Mesh, sharding: NamedSharding) -> NamedSharding:
    """``sharding`` with a leading axis over the processes."""
    return NamedSharding(mesh, P("proc", *sharding.spec))


@functools.cache
def make_split_step(spec: M.ModelSpec, mesh: Mesh, lr: float) -> SplitStep:
    """The two programs of one step on ``mesh`` (axes ``proc`` x ``data``; see the module
    docstring). Cached like the other ``make_*`` functions."""
    procs = int(mesh.shape["proc"])
    shard = M.state_shardings(spec, mesh)
    rows = NamedSharding(mesh, P("proc"))
    grads_sharding = jax.tree_util.tree_map(lambda s: _stacked(mesh, s), shard["params"])

    def partial(state: M.State, batch: M.Batch) -> tuple[jax.Array, M.State]:
        _, k_drop = jax.random.split(state["rng"])
        x, y = batch
        xs = jax.lax.with_sharding_constraint(
            x.reshape(procs, -1, x.shape[-1]), NamedSharding(mesh, P("proc", "data", None))
        )
        ys = jax.lax.with_sharding_constraint(
            y.reshape(procs, -1), NamedSharding(mesh, P("proc", "data"))
        )
        keys = jax.vmap(lambda i: jax.random.fold_in(k_drop, i))(jnp.arange(procs))

        def row(xr: jax.Array, yr: jax.Array, key: jax.Array) -> tuple[jax.Array, M.State]:
            return jax.value_and_grad(lambda p: M.loss(spec, p, (xr, yr), key))(state["params"])

        return jax.vmap(row)(xs, ys, keys)

    def apply(state: M.State, losses: jax.Array, grads: M.State) -> tuple[M.State, jax.Array]:
        rng, _ = jax.random.split(state["rng"])
        mean = jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), grads)
        return M.adam_update(state, mean, rng, lr), jnp.mean(losses)

    rep = NamedSharding(mesh, P())
    return SplitStep(
        partial=jax.jit(
            partial,
            in_shardings=(shard, M.batch_sharding(spec, mesh)),
            out_shardings=(rows, grads_sharding),
        ),
        apply=jax.jit(
            apply,
            in_shardings=(shard, rows, grads_sharding),
            out_shardings=(shard, rep),
        ),
    )


def compile_ahead(split: SplitStep, batch_fn: Any, state: Any, position: Any) -> None:
    """Compile the batch function and both programs for ``state`` and a batch at
    ``position`` without running them: no collective runs, so no peer is waited for."""
    batch_fn.lower(position).compile()
    batch = jax.eval_shape(batch_fn, position)
    split.partial.lower(state, batch).compile()  # type: ignore[attr-defined]
    losses, grads = jax.eval_shape(split.partial, state, batch)
    split.apply.lower(state, losses, grads).compile()  # type: ignore[attr-defined]


def own_work_done(tree: Any) -> None:
    """Wait until this process's shards of ``tree`` are computed (not the other processes':
    they are not on this process), which for :attr:`SplitStep.partial`'s result is this
    process's own work of the step."""
    for leaf in jax.tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            shard.data.block_until_ready()


def timed_step(split: SplitStep, clock: Callable[[], float]) -> Callable[..., Any]:
    """``(state, batch) -> (state, loss, seconds of this process's own work)``."""

    def step(state: Any, batch: Any) -> tuple[Any, Any, float]:
        t0 = clock()
        losses, grads = split.partial(state, batch)
        own_work_done((losses, grads))
        work = clock() - t0
        state, loss = split.apply(state, losses, grads)
        return state, loss, work

    return step
