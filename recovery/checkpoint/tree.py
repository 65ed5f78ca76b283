"""Between JAX pytrees and the store's flat ``path -> numpy array`` mappings."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from recovery.errors import CheckpointError


def _key_name(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def leaf_paths(tree: Any) -> list[tuple[str, Any]]:
    """``[(path, leaf)]`` in the tree's canonical order; paths look like ``params/0/w``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [("/".join(_key_name(k) for k in path), leaf) for path, leaf in flat]


def to_host(tree: Any) -> dict[str, np.ndarray]:
    """Host copies of every leaf, for saving.

    Device-to-host transfers are started for all leaves before the first one is awaited so
    they overlap. On the CPU backend the result may share memory with the (immutable) JAX
    array instead of copying: the caller must not donate those arrays while a save of them is
    in flight.
    """
    items = leaf_paths(tree)
    for _, leaf in items:
        if isinstance(leaf, jax.Array):
            leaf.copy_to_host_async()
    return {path: _host(path, leaf) for path, leaf in items}


def _host(path: str, leaf: Any) -> np.ndarray:
    """The whole of ``leaf`` from this process's own shards. In a job of several processes a
    replicated state is sharded over each process's devices only, so every process holds
    all of it, though JAX does not call such an array fully addressable.

    Raises:
        CheckpointError: this process does not hold every element of the leaf (a state
            sharded across processes cannot be saved by each of them).
    """
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
        return np.asarray(leaf)
    out = np.empty(leaf.shape, leaf.dtype)
    covered = np.zeros(leaf.shape, bool)
    for shard in leaf.addressable_shards:
        out[shard.index] = np.asarray(shard.data)
        covered[shard.index] = True
    if not covered.all():
        raise CheckpointError(
            f"state leaf {path} is sharded across processes; this process holds only part of "
            "it (the state must be replicated on every process)"
        )
    return out


def _slicer(host: np.ndarray) -> Any:
    return lambda index: host[index]


def from_host(template: Any, arrays: dict[str, np.ndarray]) -> Any:
    """A tree shaped like ``template`` with the saved arrays, placed with its shardings.

    ``template`` leaves may be arrays or ``jax.ShapeDtypeStruct`` (from ``jax.eval_shape``);
    a leaf with a ``sharding`` gets its array placed that way, others stay numpy.

    Raises:
        CheckpointError: the saved leaves do not match the template (names, dtypes, shapes).
    """
    items = leaf_paths(template)
    expected = [p for p, _ in items]
    missing = [p for p in expected if p not in arrays]
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise CheckpointError(
            "checkpoint leaves do not match the model's state: "
            f"missing {missing or 'none'}, unexpected {extra or 'none'}"
        )
    for path, tmpl in items:
        arr = arrays[path]
        t_dtype, t_shape = np.dtype(tmpl.dtype), tuple(np.shape(tmpl))
        if arr.dtype != t_dtype or arr.shape != t_shape:
            raise CheckpointError(
                f"checkpoint leaf {path} is {arr.dtype}{list(arr.shape)}, "
                f"the model expects {t_dtype}{list(t_shape)}"
            )
    leaves: list[Any] = [arrays[path] for path, _ in items]
    placed = [i for i, (_, t) in enumerate(items) if getattr(t, "sharding", None) is not None]
    local = [i for i in placed if items[i][1].sharding.is_fully_addressable]
    if local:
        # One batched transfer: per-leaf device_put calls cost ~0.1 ms each in dispatch.
        moved = jax.device_put([leaves[i] for i in local], [items[i][1].sharding for i in local])
        for i, arr in zip(local, moved, strict=True):
            leaves[i] = arr
    for i in placed:
        # A sharding over several processes' devices: each places its own shards, every
        # process holding the whole array (the state is replicated across processes).
        sharding = items[i][1].sharding
        if not sharding.is_fully_addressable:
            leaves[i] = jax.make_array_from_callback(leaves[i].shape, sharding, _slicer(leaves[i]))
    treedef = jax.tree_util.tree_structure(template)
    return jax.tree_util.tree_unflatten(treedef, leaves)
