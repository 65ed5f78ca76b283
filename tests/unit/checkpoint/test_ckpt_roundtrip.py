"""Round trips: every byte, dtype, shape, memory layout and the manifest's fields come back."""

from __future__ import annotations

import json
import math
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import xxhash

from recovery.checkpoint import CheckpointStore
from recovery.errors import RecoverError, UsageError

AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]

DTYPES = [
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int8",
    "int32",
    "int64",
    "uint8",
    "uint32",
    "bool",
    "complex64",
]
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (4, 5), (2, 3, 4)]


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _example(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values that cover each dtype's corners (extremes, NaN, inf, -0.0) where it has them."""
    dtype = _dtype(name)
    rng = np.random.default_rng(seed)
    size = math.prod(shape)
    if dtype == np.bool_:
        flat = rng.integers(0, 2, size).astype(bool)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, size, endpoint=True, dtype=dtype)
        flat[:2] = [info.min, info.max][: min(2, size)]
    elif np.issubdtype(dtype, np.complexfloating):
        flat = (rng.standard_normal(size) + 1j * rng.standard_normal(size)).astype(dtype)
    else:
        flat = (rng.standard_normal(size) * 100).astype(dtype)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32).astype(dtype)
        k = min(size, len(specials))
        flat[:k] = specials[:k]
    return flat.reshape(shape)


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_and_shape_round_trips_bit_exact(
    store: CheckpointStore, run_config: dict[str, Any], assert_same: AssertSame, name: str
) -> None:
    arrays = {f"x/{i}": _example(name, shape, seed=i) for i, shape in enumerate(SHAPES)}
    result = store.save(3, arrays, run_config=run_config)

    loaded = store.load(3, run_config=run_config)

    assert_same(loaded.arrays, arrays)
    assert result.total_bytes == sum(a.nbytes for a in arrays.values())
    assert result.path == store.step_path(3)
    assert [e.dtype for e in loaded.manifest.leaves] == [name] * len(SHAPES)


def test_non_contiguous_fortran_and_big_endian_inputs(
    store: CheckpointStore, run_config: dict[str, Any], assert_same: AssertSame
) -> None:
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    arrays: dict[str, np.ndarray] = {
        "strided": base[::2, 1::3],
        "transposed": base.T,
        "fortran": np.asfortranarray(base),
        "negative_stride": base[::-1],
        "broadcast": np.broadcast_to(np.arange(3, dtype=np.int16), (4, 3)),
        "be_f32": np.array([1.5, -2.25, np.inf], dtype=">f4"),
        "be_f16": np.array([[0.5, -1.0]], dtype=">f2"),
        "be_i64": np.array([1, -(2**40), 2**62], dtype=">i8"),
        "be_u32": np.array(7, dtype=">u4"),
        "be_strided": np.arange(20, dtype=">i4")[::3],
    }
    assert not arrays["strided"].flags.c_contiguous

    store.save(1, arrays, run_config=run_config)
    loaded = store.load(1)

    assert_same(loaded.arrays, arrays)
    for name, a in arrays.items():
        got = loaded.arrays[name]
        np.testing.assert_array_equal(got, a)
        assert got.dtype.byteorder in ("=", "|"), name
    # On disk: little-endian, C order, whatever the input layout was.
    leaf = {e.path: e for e in loaded.manifest.leaves}["be_i64"]
    raw = (store.step_path(1) / leaf.file).read_bytes()[leaf.offset : leaf.offset + leaf.nbytes]
    assert raw == np.array([1, -(2**40), 2**62], dtype="<i8").tobytes()
    assert leaf.dtype == "int64"


def test_input_arrays_are_not_modified(store: CheckpointStore, run_config: dict[str, Any]) -> None:
    a = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    before = a.copy()
    store.save(1, {"a": a}, run_config=run_config)
    np.testing.assert_array_equal(a, before)
    assert a.dtype == np.dtype(">i4")


def test_metadata_run_config_and_timestamp_round_trip(
    store: CheckpointStore, clock: Any, arrays_for: Callable[[int], dict[str, np.ndarray]]
) -> None:
    run_config = {"model": "tiny", "lr": 3e-4, "batch": 32, "mesh": [2, 4], "opt": {"b1": 0.9}}
    metadata = {"loss": 1.25, "tokens": 123_456_789_012, "note": "ünïcode ✓", "hist": [1, 2.5]}
    clock.now = 1_234_567_890.5

    store.save(8, arrays_for(8), run_config=run_config, metadata=metadata)
    manifest = store.load(8, run_config=run_config).manifest

    assert manifest.metadata == metadata
    assert manifest.run_config == run_config
    assert manifest.created_unix == 1_234_567_890.5
    assert manifest.step == 8
    assert manifest.total_bytes == sum(a.nbytes for a in arrays_for(8).values())


def test_resaving_a_step_replaces_it(
    store: CheckpointStore,
    run_config: dict[str, Any],
    arrays_for: Callable[[int], dict[str, np.ndarray]],
    assert_same: AssertSame,
) -> None:
    store.save(5, arrays_for(1), run_config=run_config)
    store.save(5, arrays_for(2), run_config=run_config, metadata={"second": True})

    loaded = store.load(5)
    assert_same(loaded.arrays, arrays_for(2))
    assert loaded.manifest.metadata == {"second": True}
    assert store.steps() == [5]
    assert [p.name for p in store.root.iterdir() if p.name != ".lock"] == ["step_00000005"]


def test_leaf_files_read_with_numpy_alone_as_the_format_doc_says(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    arrays = {
        "params/w": _example("bfloat16", (3, 4), 1),
        "params/b": _example("float32", (4,), 2),
        "step": np.array(7, dtype=np.int64),
        "mask": _example("bool", (2, 2), 3),
        "empty": np.zeros((0, 5), dtype=np.float16),
    }
    store.save(7, arrays, run_config=run_config)
    directory = store.root / "step_00000007"

    # Only json, numpy (plus ml_dtypes for bfloat16) and xxhash: the reader in the doc.
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "recover-checkpoint"
    assert manifest["format_version"] == 1
    assert manifest["digest_algorithm"] == "xxh3_128"
    assert manifest["files"] == [
        {"name": "D00000.bin", "nbytes": (directory / "D00000.bin").stat().st_size}
    ]
    assert sorted(p.name for p in directory.iterdir()) == ["D00000.bin", "manifest.json"]
    sizes = {f["name"]: f["nbytes"] for f in manifest["files"]}
    by_path = {}
    for leaf in manifest["leaves"]:
        assert set(leaf) == {"path", "file", "offset", "dtype", "shape", "nbytes", "digest"}
        assert leaf["offset"] % 64 == 0
        assert leaf["offset"] + leaf["nbytes"] <= sizes[leaf["file"]]
        data = np.fromfile(
            directory / leaf["file"],
            dtype=leaf["dtype"],
            count=math.prod(leaf["shape"]),
            offset=leaf["offset"],
        ).reshape(leaf["shape"])
        by_path[leaf["path"]] = data
        raw = (directory / leaf["file"]).read_bytes()[
            leaf["offset"] : leaf["offset"] + leaf["nbytes"]
        ]
        assert len(raw) == leaf["nbytes"] == data.nbytes
        assert leaf["digest"] == xxhash.xxh3_128_hexdigest(raw)
        assert len(leaf["digest"]) == 32
        assert leaf["digest"] == leaf["digest"].lower()
    assert sorted(by_path) == sorted(arrays)
    for name, a in arrays.items():
        assert by_path[name].dtype == a.dtype
        assert by_path[name].tobytes() == a.tobytes()
    assert manifest["total_bytes"] == sum(leaf["nbytes"] for leaf in manifest["leaves"])

    # The manifest checksum, recomputed exactly as the doc describes it.
    body = {k: v for k, v in manifest.items() if k != "manifest_checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert manifest["manifest_checksum"] == xxhash.xxh3_128_hexdigest(canonical.encode())
    canonical_cfg = json.dumps(run_config, sort_keys=True, separators=(",", ":"))
    assert manifest["run_config_id"] == xxhash.xxh3_128_hexdigest(canonical_cfg.encode())
    # The manifest itself is stored in that canonical form.
    assert (directory / "manifest.json").read_bytes() == json.dumps(
        manifest, sort_keys=True, separators=(",", ":")
    ).encode()


def test_object_arrays_are_refused_never_pickled(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    with pytest.raises((TypeError, RecoverError)):
        store.save(1, {"o": np.array([{"a": 1}, None], dtype=object)}, run_config=run_config)
    assert store.steps() == []


@pytest.mark.parametrize(
    "array",
    [
        np.array(["ab", "c"]),
        np.array([b"xy", b"z"]),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.zeros(2, dtype="V8"),
    ],
    ids=["str", "bytes", "structured", "void"],
)
def test_dtypes_that_cannot_round_trip_are_refused_at_save(
    store: CheckpointStore, run_config: dict[str, Any], array: np.ndarray
) -> None:
    with pytest.raises(UsageError, match="'a'"):
        store.save(1, {"ok": np.ones(3), "a": array}, run_config=run_config)
    assert not store.root.exists() or list(store.root.iterdir()) == []  # before any write


@pytest.mark.parametrize(
    "array",
    [
        np.array([1, -2], dtype="datetime64[s]"),
        np.array([3, 4], dtype=">m8[ms]"),
        np.array([1.0, -0.0], dtype=ml_dtypes.float8_e4m3fn),
    ],
    ids=["datetime64", "big-endian-timedelta64", "float8"],
)
def test_other_plain_dtypes_round_trip(
    store: CheckpointStore, run_config: dict[str, Any], assert_same: AssertSame, array: np.ndarray
) -> None:
    store.save(1, {"a": array}, run_config=run_config)
    assert_same(store.load(1).arrays, {"a": array})


@pytest.mark.parametrize(
    ("metadata", "run_config_extra"),
    [
        ({"loss": float("nan")}, {}),
        ({"loss": float("inf")}, {}),
        ({}, {"path": Path("/data")}),
        ({"arr": np.float32(1.0)}, {}),
    ],
    ids=["nan-metadata", "inf-metadata", "path-in-run-config", "numpy-scalar-metadata"],
)
def test_unserializable_metadata_is_a_usage_error_before_any_write(
    store: CheckpointStore,
    run_config: dict[str, Any],
    arrays_for: Callable[[int], dict[str, np.ndarray]],
    metadata: dict[str, Any],
    run_config_extra: dict[str, Any],
) -> None:
    with pytest.raises(UsageError):
        store.save(
            1, arrays_for(1), run_config={**run_config, **run_config_extra}, metadata=metadata
        )
    assert not store.root.exists() or list(store.root.iterdir()) == []


def test_the_reader_example_in_the_format_doc_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_config: dict[str, Any],
    arrays_for: Callable[[int], dict[str, np.ndarray]],
    assert_same: AssertSame,
) -> None:
    doc = Path(__file__).parents[3] / "docs" / "checkpoint-format.md"
    text = doc.read_text()
    section = text[text.index("## Reading a checkpoint with numpy alone") :]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "reader.py"
    script.write_text(code)
    arrays = {**arrays_for(8), "half": _example("bfloat16", (2, 3), 0)}
    CheckpointStore(tmp_path / "run" / "checkpoints").save(
        8, arrays, run_config=run_config, metadata={"loss": 0.5}
    )
    monkeypatch.chdir(tmp_path)

    namespace = runpy.run_path(str(script))

    assert_same(namespace["arrays"], arrays)
    assert namespace["manifest"]["metadata"] == {"loss": 0.5}


def test_key_implementations_are_recorded_per_leaf_and_read_back(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    # The data of one JAX threefry PRNG key (the store knows no JAX: it records what it is told).
    arrays = {"rng": np.array([0, 7], np.uint32), "w": np.ones(2, np.float32)}
    result = store.save(1, arrays, run_config=run_config, key_impls={"rng": "threefry2x32"})
    manifest = json.loads((result.path / "manifest.json").read_text())
    entries = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    assert entries["rng"]["key_impl"] == "threefry2x32"
    assert "key_impl" not in entries["w"]  # an array without keys: the entry of old
    loaded = store.load(1)
    assert loaded.key_impls == {"rng": "threefry2x32"}
    assert loaded.state_digest == result.state_digest
    # The implementation is part of what the digest says is the same state.
    plain = store.save(2, arrays, run_config=run_config)
    assert plain.state_digest != result.state_digest
    assert store.load(2).key_impls == {}


def test_a_key_implementation_for_no_leaf_is_refused(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    with pytest.raises(UsageError, match=r"paths that are no leaf: \['rngs'\]"):
        store.save(
            1, {"rng": np.zeros(2, np.uint32)}, run_config=run_config, key_impls={"rngs": "rbg"}
        )
    assert store.steps() == []
