"""Training states as the store's flat ``leaf path -> numpy array`` mappings, and back.

Builds on :mod:`recovery.checkpoint.tree` (the paths ``recover train`` uses) with what user
code brings: Flax and Optax states (dataclasses, named tuples, custom pytree nodes, Flax NNX
``State``), Python scalars as leaves (``TrainState.create`` starts ``step`` at the int 0),
mutable numpy leaves, JAX arrays whose buffers a jitted step may donate while a background
save still reads them, and typed PRNG keys (``jax.random.key``, what ``nnx.Rngs`` holds).

A typed key has no numpy form, so a leaf of keys is stored as its ``jax.random.key_data``
(plain ``uint32``) with its key implementation recorded beside it in the manifest; a restore
whose template holds keys of that implementation wraps the data back into the same keys.

Imports JAX inside the functions, so that ``import recovery.api`` does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from recovery.errors import CheckpointError, UsageError

if TYPE_CHECKING:
    import jax

_SCALARS = (bool, int, float, complex)
# numpy dtype kinds a Python scalar leaf of each type may be restored from
_SCALAR_KINDS = {bool: "b", int: "biu", float: "biuf", complex: "biufc"}
# The Python ints numpy stores in 64 bits (int64, or uint64 above its range).
_INT_RANGE = range(-(2**63), 2**64)


class Flat(NamedTuple):
    """A state as the store saves it."""

    arrays: dict[str, np.ndarray]
    """``leaf path -> host array``, in the tree's order; a leaf of PRNG keys as its data."""
    key_impls: dict[str, str]
    """``leaf path -> key implementation`` of the leaves that were typed PRNG keys."""


def flatten(state: Any, *, private: bool) -> Flat:
    """Host arrays of every leaf of ``state``, keyed by leaf path (``params/dense/kernel``).

    With ``private`` every array is one nobody else can change or free while a background
    save reads it: numpy leaves are copied (the caller may update them in place), and so are
    JAX arrays on the CPU backend, whose host view shares the device buffer that a jitted step
    with ``donate_argnums`` reuses. Arrays on an accelerator come back as fresh host copies.
    A leaf of typed PRNG keys becomes its ``jax.random.key_data``, its implementation noted
    in :attr:`Flat.key_impls`. ``None`` is an empty subtree in JAX, not a leaf: nothing is
    saved for it, and a template's ``None`` restores as ``None``.

    Raises:
        UsageError: a leaf is not an array or a number (a string, bytes, an object), an int
            beyond 64 bits, or two leaves get the same path (a dict key containing ``/`` next
            to a nested key). The message names the leaf.
    """
    import jax

    from recovery.checkpoint import tree

    items = tree.leaf_paths(state)
    seen: set[str] = set()
    key_impls: dict[str, str] = {}
    for i, (path, leaf) in enumerate(items):
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
        if type(leaf) is int and leaf not in _INT_RANGE:
            raise UsageError(
                f"leaf {path!r} is the int {leaf}, beyond 64 bits; a checkpoint holds ints "
                f"from {_INT_RANGE.start} to {_INT_RANGE.stop - 1}"
            )
        if isinstance(leaf, jax.Array) and is_keys(leaf):
            key_impls[path] = str(jax.random.key_impl(leaf))
            items[i] = (path, jax.random.key_data(leaf))
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
    return Flat({path: _host(leaf, private=private) for path, leaf in items}, key_impls)


def is_keys(leaf: Any) -> bool:
    """Whether ``leaf`` (an array or a ``jax.ShapeDtypeStruct``) holds typed PRNG keys."""
    import jax

    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


def key_layout(leaf: Any) -> tuple[str, jax.ShapeDtypeStruct]:
    """The key implementation of a leaf of typed keys (an array or a ``ShapeDtypeStruct``)
    and the shape and dtype of its key data; nothing is computed."""
    import jax

    impls: list[str] = []

    def data(keys: jax.Array) -> jax.Array:
        impls.append(str(jax.random.key_impl(keys)))
        return jax.random.key_data(keys)

    layout = jax.eval_shape(data, leaf)
    return impls[0], layout


def _host(leaf: Any, *, private: bool) -> np.ndarray:
    import jax

    if not private:
        return np.asarray(leaf)
    if isinstance(leaf, jax.Array) and all(d.platform != "cpu" for d in leaf.devices()):
        return np.asarray(leaf)  # the transfer made a host copy of its own
    return np.array(leaf, copy=True)


def unflatten(
    template: Any, arrays: dict[str, np.ndarray], key_impls: dict[str, str] | None = None
) -> Any:
    """A tree shaped like ``template`` holding ``arrays``.

    Template leaves may be arrays, ``jax.ShapeDtypeStruct`` (from ``jax.eval_shape``) or
    Python numbers. A leaf with a ``sharding`` gets its array placed that way, a
    ``ShapeDtypeStruct`` without one goes to this process's default device (its first local
    one); numpy leaves stay numpy; a Python number comes back as a number of the same type.
    A template leaf of typed PRNG keys takes the saved key data of the same implementation
    (``key_impls``, from the manifest) back as those keys, bit for bit, placed like the
    template's.

    Raises:
        CheckpointError: the saved leaves do not match the template (names, dtypes, shapes,
            PRNG keys of another implementation or none at all), naming each difference.
        UsageError: a template leaf of keys has a sharding other than a ``NamedSharding``
            or a single device's.
    """
    import jax

    from recovery.checkpoint import tree

    key_impls = key_impls or {}
    paths = [p for p, _ in tree.leaf_paths(template)]
    leaves, treedef = jax.tree_util.tree_flatten(template)
    scalar_types: dict[int, type] = {}
    keys: dict[int, str] = {}
    # This process's default device: in a job of several processes jax.devices()[0] is
    # process 0's, which no other process can place anything on.
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    for i, (path, leaf) in enumerate(zip(paths, leaves, strict=True)):
        saved_impl = key_impls.get(path) if path in arrays else None
        if is_keys(leaf):
            impl, data = key_layout(leaf)
            if path in arrays and saved_impl != impl:
                saved = arrays[path]
                held = (
                    f"holds {saved_impl} PRNG keys"
                    if saved_impl
                    else f"is {saved.dtype}{list(saved.shape)}, not PRNG keys"
                )
                raise CheckpointError(
                    f"checkpoint leaf {path} {held}; the model expects {impl} keys"
                    f"{list(leaf.shape)}"
                )
            sharding = _data_sharding(path, getattr(leaf, "sharding", None) or default)
            leaves[i] = jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)  # type: ignore[no-untyped-call]
            keys[i] = impl
        elif saved_impl is not None:
            raise CheckpointError(
                f"checkpoint leaf {path} holds {saved_impl} PRNG keys; the model expects "
                f"{_expected(leaf)}"
            )
        elif isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
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
    if not scalar_types and not keys:
        return restored
    out: list[Any] = jax.tree_util.tree_leaves(restored)
    for i, kind in scalar_types.items():
        out[i] = kind(out[i].item())
    for i, impl in keys.items():
        # Placed as the data was, each process wrapping its own shards. (JAX spells a key
        # array's replicated layout P(None,), an equivalent of the template's P().)
        out[i] = jax.random.wrap_key_data(out[i], impl=impl)
    return jax.tree_util.tree_unflatten(treedef, out)


def _data_sharding(path: str, sharding: Any) -> Any:
    """Where the data of keys laid out by ``sharding`` goes: the same mesh and partition
    (the data's extra last axis, the words of one key, is not split), or the same device."""
    import jax

    if isinstance(sharding, jax.sharding.NamedSharding | jax.sharding.SingleDeviceSharding):
        return sharding
    raise UsageError(
        f"template leaf {path!r} holds PRNG keys laid out by a {type(sharding).__name__}; "
        "keys are restored onto a NamedSharding or a SingleDeviceSharding"
    )


def _expected(leaf: Any) -> str:
    """What a template leaf asks for, as the errors say it."""
    if isinstance(leaf, _SCALARS):
        return f"a Python {type(leaf).__name__}"
    return f"{np.dtype(leaf.dtype)}{list(np.shape(leaf))}"
