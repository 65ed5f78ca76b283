"""Between JAX pytrees and flat host arrays, through a real store."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore
from recovery.checkpoint.tree import from_host, leaf_paths, to_host
from recovery.errors import CheckpointError


def _state() -> dict[str, Any]:
    key = jax.random.PRNGKey(42)
    return {
        "params": {
            "layers": [
                {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.zeros(3)},
                {"w": jnp.ones((3, 1), dtype=jnp.bfloat16), "b": jnp.full(1, -0.5)},
            ],
        },
        "step": jnp.asarray(17, dtype=jnp.int32),
        "rng": key,
        "mask": jnp.asarray([True, False]),
    }


def test_paths_are_readable_and_stable() -> None:
    assert [p for p, _ in leaf_paths(_state())] == [
        "mask",
        "params/layers/0/b",
        "params/layers/0/w",
        "params/layers/1/b",
        "params/layers/1/w",
        "rng",
        "step",
    ]


def test_pytree_round_trip_through_the_store(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    state = _state()
    host = to_host(state)

    assert all(isinstance(a, np.ndarray) for a in host.values())
    assert host["rng"].dtype == np.uint32
    assert host["rng"].shape == (2,)
    assert host["params/layers/1/w"].dtype.name == "bfloat16"

    store.save(17, host, run_config=run_config)
    loaded = store.load(17, run_config=run_config)
    restored = from_host(_state(), loaded.arrays)

    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)  # type: ignore[operator]
    for (path, got), (_, want) in zip(leaf_paths(restored), leaf_paths(state), strict=True):
        assert isinstance(got, jax.Array), path
        assert got.dtype == want.dtype, path
        assert got.shape == want.shape, path
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), path
        assert got.sharding == want.sharding, path
    # The restored key draws the same numbers as the saved one.
    np.testing.assert_array_equal(
        jax.random.normal(restored["rng"], (4,)), jax.random.normal(state["rng"], (4,))
    )


def test_numpy_template_leaves_stay_numpy(store: CheckpointStore) -> None:
    template = {"a": np.zeros(3, dtype=np.int64)}
    out = from_host(template, {"a": np.arange(3, dtype=np.int64)})
    assert isinstance(out["a"], np.ndarray)
    np.testing.assert_array_equal(out["a"], [0, 1, 2])


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (
            lambda a: a.update({"params/layers/0/w": np.zeros((3, 3), np.float32)}),
            ["params/layers/0/w", "float32[3, 3]", "expects float32[2, 3]"],
        ),
        (
            lambda a: a.update({"step": np.asarray(17, np.int64)}),
            ["step", "int64[]", "expects int32[]"],
        ),
        (
            lambda a: a.update({"rng": np.zeros(2, np.int32)}),
            ["rng", "int32[2]", "expects uint32[2]"],
        ),
        (lambda a: a.pop("mask"), ["missing ['mask']", "unexpected none"]),
        (
            lambda a: a.update({"params/layers/2/w": np.zeros(1)}),
            ["missing none", "unexpected ['params/layers/2/w']"],
        ),
    ],
    ids=["shape", "dtype", "key-dtype", "missing", "unexpected"],
)
def test_mismatching_template_names_the_leaf(edit: Any, fragments: list[str]) -> None:
    arrays = to_host(_state())
    edit(arrays)
    with pytest.raises(CheckpointError) as info:
        from_host(_state(), arrays)
    for fragment in fragments:
        assert fragment in str(info.value)
