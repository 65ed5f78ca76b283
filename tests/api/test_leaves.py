"""What a user's loop holds, leaf by leaf: typed PRNG keys (``jax.random.key``, what
``flax.nnx.Rngs`` holds) are saved as their key data and come back as the same keys, bit for
bit; ``None`` is an empty subtree; anything that is no array or number is refused with a
``UsageError`` naming its leaf before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xxhash
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from recovery.api import CheckpointError, CheckpointManager, UsageError
from recovery.checkpoint import format as fmt

MODES = pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
IMPLS = ["threefry2x32", "rbg", "unsafe_rbg"]


def keys(seed: int, impl: str = "threefry2x32") -> dict[str, Any]:
    """A scalar key, a batch of split keys, and a plain array beside them."""
    root = jax.random.key(seed, impl=impl)
    return {"rng": root, "split": jax.random.split(root, 3), "w": jnp.arange(4.0) + seed}


def same_keys(a: jax.Array, b: jax.Array) -> bool:
    """The same key type, shape and key data (which is what makes the same random numbers)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    )


def manifest(directory: Path, step: int) -> dict[str, Any]:
    return json.loads((directory / fmt.step_dir_name(step) / fmt.MANIFEST).read_text())  # type: ignore[no-any-return]


@MODES
@pytest.mark.parametrize("impl", IMPLS)
def test_typed_keys_come_back_as_the_same_keys(tmp_path: Path, async_save: bool, impl: str) -> None:
    saved = keys(7, impl)
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        mgr.save(1, saved)
    reader = CheckpointManager(tmp_path, read_only=True)
    for template in (keys(0, impl), jax.eval_shape(lambda: keys(0, impl))):
        got = reader.restore(template).state
        assert same_keys(got["rng"], saved["rng"])
        assert same_keys(got["split"], saved["split"])
        assert not same_keys(got["rng"], keys(0, impl)["rng"])  # the check can fail
        # The restored keys draw what the saved ones would have drawn.
        assert np.array_equal(
            jax.random.normal(got["split"][1], (5,)), jax.random.normal(saved["split"][1], (5,))
        )
    # On disk: the keys' data, plain uint32 readable with numpy, and the implementation.
    leaves = {leaf["path"]: leaf for leaf in manifest(tmp_path, 1)["leaves"]}
    assert leaves["rng"]["key_impl"] == leaves["split"]["key_impl"] == impl
    assert leaves["rng"]["dtype"] == "uint32"
    assert "key_impl" not in leaves["w"]
    arrays = reader.restore_arrays().state
    np.testing.assert_array_equal(arrays["split"], jax.random.key_data(saved["split"]))


def test_keys_are_placed_like_the_template(tmp_path: Path) -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    sharding = NamedSharding(mesh, P("d"))  # type: ignore[no-untyped-call]
    saved = keys(3)
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, saved)
        template = jax.eval_shape(lambda: keys(0))
        template["split"] = jax.ShapeDtypeStruct((3,), template["split"].dtype, sharding=sharding)  # type: ignore[no-untyped-call]
        got = mgr.restore(template).state
    assert got["split"].sharding == sharding
    assert same_keys(got["split"], saved["split"])


def test_keys_of_another_implementation_or_none_are_refused(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, {"rng": jax.random.key(1, impl="rbg")})
        mgr.save(2, {"rng": jax.random.PRNGKey(1)})  # a legacy raw uint32 key
        # rbg and unsafe_rbg keys have the same data shape: only the record tells them apart.
        with pytest.raises(CheckpointError, match=r"rng holds rbg PRNG keys.*unsafe_rbg keys"):
            mgr.restore({"rng": jax.random.key(0, impl="unsafe_rbg")}, step=1)
        with pytest.raises(CheckpointError, match=r"rng is uint32\[2\], not PRNG keys"):
            mgr.restore({"rng": jax.random.key(0)}, step=2)
        with pytest.raises(CheckpointError, match=r"rng holds rbg PRNG keys.*uint32\[4\]"):
            mgr.restore({"rng": jnp.zeros(4, jnp.uint32)}, step=1)
        # The record is what decides, not the template's luck of shape: a match restores.
        got = mgr.restore({"rng": jax.random.key(0, impl="rbg")}, step=1).state
    assert same_keys(got["rng"], jax.random.key(1, impl="rbg"))


def test_key_implementation_is_part_of_the_state_digest(tmp_path: Path) -> None:
    data = jax.random.key_data(jax.random.key(5, impl="rbg"))
    digests = []
    for i, impl in enumerate(("rbg", "unsafe_rbg")):
        with CheckpointManager(tmp_path / impl, async_save=False) as mgr:
            result = mgr.save(i, {"rng": jax.random.wrap_key_data(data, impl=impl)})
        assert result is not None
        digests.append(result.state_digest)
    assert digests[0] != digests[1]


def test_a_state_without_keys_is_saved_as_before(tmp_path: Path) -> None:
    # No key_impl anywhere, and the digest is version 1's formula over the leaf entries:
    # checkpoints written before keys could be saved read and digest the same.
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        result = mgr.save(1, {"w": jnp.ones(3), "n": 4})
    assert result is not None
    entries = manifest(tmp_path, 1)["leaves"]
    assert all(
        set(e) == {"path", "file", "offset", "dtype", "shape", "nbytes", "digest"} for e in entries
    )
    rows = [[e["path"], e["dtype"], e["shape"], e["digest"]] for e in entries]
    assert result.state_digest == xxhash.xxh3_128_hexdigest(fmt.canonical_json(rows))


def test_none_is_an_empty_subtree(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, {"ema": None, "w": jnp.ones(2)})
        got = mgr.restore({"ema": None, "w": jnp.zeros(2)}).state
    assert got["ema"] is None
    assert [leaf["path"] for leaf in manifest(tmp_path, 1)["leaves"]] == ["w"]


@pytest.mark.parametrize(
    ("leaf", "says"),
    [
        ("adam", r"leaf 'opt/name' is a str"),
        (b"\x00", r"leaf 'opt/name' is a bytes"),
        (object(), r"leaf 'opt/name' is a object"),
        (np.str_("adam"), r"leaf 'opt/name' has dtype <U4, which cannot be stored"),
        (np.array([{"a": 1}], dtype=object), r"leaf 'opt/name' has dtype object"),
        (2**64, r"leaf 'opt/name' is the int 18446744073709551616, beyond 64 bits"),
    ],
    ids=["str", "bytes", "object", "numpy-str", "object-array", "big-int"],
)
def test_a_leaf_that_is_no_array_or_number_is_refused_by_name(
    tmp_path: Path, leaf: Any, says: str
) -> None:
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(UsageError, match=says):
            mgr.save(1, {"opt": {"name": leaf}, "w": jnp.ones(2)})
        assert mgr.wait() is None
    assert mgr.steps() == []


@pytest.mark.parametrize("value", [True, -(2**63), 2**64 - 1, 2.5, 1 - 2j])
def test_python_numbers_come_back_as_numbers_of_their_type(tmp_path: Path, value: Any) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, {"x": value})
        got = mgr.restore({"x": type(value)(0)}).state["x"]
    assert type(got) is type(value)
    assert got == value
