"""Training states as the store's flat ``leaf path -> numpy array`` mappings, and back.

Builds on :mod:`recovery.checkpoint.tree` (the paths ``recover train`` uses) with what user
code brings: Flax and Optax states (dataclasses, named tuples, custom pytree nodes), Python
scalars as leaves (``TrainState.create`` starts ``step`` at the int 0), mutable numpy leaves,
and JAX arrays whose buffers a jitted step may donate while a background save still reads them.

Imports JAX inside the functions, so that ``import recovery.api`` does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recovery.errors import CheckpointError, UsageError

_SCALARS = (bool, int, float, complex)
# numpy dtype kinds a Python scalar leaf of each type may be restored from
_SCALAR_KINDS = {bool: "b", int: "biu", float: "biuf", complex: "biufc"}


def flatten(state: Any, *, private: bool) -> dict[str, np.ndarray]:
    """Host arrays of every leaf of ``state``, keyed by leaf path (``params/dense/kernel``).

    With ``private`` every array is one nobody else can change or free while a background
    save reads it: numpy leaves are copied (the caller may update them in place), and so are
    JAX arrays on the CPU backend, whose host view shares the device buffer that a jitted step
    with ``donate_argnums`` reuses. Arrays on an accelerator come back as fresh host copies.

    Raises:
        UsageError: a leaf is not an array or a number (a string, an object), or two leaves
            get the same path (a dict key containing ``/`` next to a nested key).
    """
    import jax

    from recovery.checkpoint import tree

    items = tree.leaf_paths(state)
    seen: set[str] = set()
    for path, leaf in items:
        if path in seen:
            raise UsageError(
                f"two leaves of the state have the path {path!r}; rename the key that "
                "contains '/' so every leaf path is unique"
            )
        seen.add(path)
        if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, *_SCALARS)):
            raise UsageError(
                f"leaf {path!r} is a {type(leaf).__name__}; a checkpoint holds arrays and "
                "numbers only (mark other fields static, e.g. flax.struct.field(pytree_node="
                "False))"
            )
    # An array sharded over several processes' devices: every process needs all of it (each
    # writes a share of the save), so it is gathered here - a collective of every process,
    # which all of them reach because they all save the same steps.
    spread = []
    for i, (path, leaf) in enumerate(items):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            if leaf.is_fully_replicated:  # every process holds all of it: no collective
                items[i] = (path, leaf.addressable_data(0))
            else:
                spread.append(i)
    if spread:
        from jax.experimental import multihost_utils

        whole = multihost_utils.process_allgather([items[i][1] for i in spread], tiled=True)
        for i, arr in zip(spread, whole, strict=True):
            items[i] = (items[i][0], np.asarray(arr))
    # Start every device-to-host transfer before waiting on the first, so they overlap.
    for _, leaf in items:
        if isinstance(leaf, jax.Array):
            leaf.copy_to_host_async()
    return {path: _host(leaf, private=private) for path, leaf in items}


def _host(leaf: Any, *, private: bool) -> np.ndarray:
    import jax

    if not private:
        return np.asarray(leaf)
    if isinstance(leaf, jax.Array) and all(d.platform != "cpu" for d in leaf.devices()):
        return np.asarray(leaf)  # the transfer made a host copy of its own
    return np.array(leaf, copy=True)


def unflatten(template: Any, arrays: dict[str, np.ndarray]) -> Any:
    """A tree shaped like ``template`` holding ``arrays``.

    Template leaves may be arrays, ``jax.ShapeDtypeStruct`` (from ``jax.eval_shape``) or
    Python numbers. A leaf with a ``sharding`` gets its array placed that way, a
    ``ShapeDtypeStruct`` without one goes to the default device; numpy leaves stay numpy; a
    Python number comes back as a number of the same type.

    Raises:
        CheckpointError: the saved leaves do not match the template (names, dtypes, shapes),
            naming each difference.
    """
    import jax

    from recovery.checkpoint import tree

    paths = [p for p, _ in tree.leaf_paths(template)]
    leaves, treedef = jax.tree_util.tree_flatten(template)
    scalar_types: dict[int, type] = {}
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for i, (path, leaf) in enumerate(zip(paths, leaves, strict=True)):
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
            # jax.eval_shape's leaves: JAX arrays were asked for, on the default device.
            leaves[i] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=default)  # type: ignore[no-untyped-call]
        elif isinstance(leaf, _SCALARS) and path in arrays:
            saved = arrays[path]
            kind = type(leaf)
            if saved.shape != () or saved.dtype.kind not in _SCALAR_KINDS[kind]:
                raise CheckpointError(
                    f"checkpoint leaf {path} is {saved.dtype}{list(saved.shape)}, the model "
                    f"expects a Python {kind.__name__}"
                )
            scalar_types[i] = kind
            leaves[i] = jax.ShapeDtypeStruct((), saved.dtype)  # type: ignore[no-untyped-call]
    restored = tree.from_host(jax.tree_util.tree_unflatten(treedef, leaves), arrays)
    if not scalar_types:
        return restored
    out: list[Any] = jax.tree_util.tree_leaves(restored)
    for i, kind in scalar_types.items():
        out[i] = kind(out[i].item())
    return jax.tree_util.tree_unflatten(treedef, out)
