"""Packed data files: which leaves go where, aligned offsets, and arrays read back aligned."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.checkpoint import CheckpointStore
from recovery.checkpoint import files as files_mod
from recovery.checkpoint import format as fmt

AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]
SplitInto = Callable[[int], None]
MiB = 1024 * 1024
ALIGN = 64

# --- plan_files: the pure rule ----------------------------------------------------------------


def _loads(plan: list[list[int]], sizes: list[int]) -> list[int]:
    return [sum(sizes[i] + ALIGN for i in group) for group in plan]


def test_no_leaves_no_files() -> None:
    assert files_mod.plan_files([], max_files=16) == []


@pytest.mark.parametrize("sizes", [[0], [4], [512, 64, 4], [0, 0, 0], [1] * 300])
def test_a_small_state_is_one_file_in_leaf_order(sizes: list[int]) -> None:
    assert files_mod.plan_files(sizes, max_files=16) == [list(range(len(sizes)))]


def test_file_target_is_32_mib() -> None:
    assert 32 * MiB == files_mod.FILE_TARGET
    assert files_mod.plan_files([16 * MiB, 16 * MiB], max_files=16) == [[0, 1]]
    assert len(files_mod.plan_files([16 * MiB, 16 * MiB + 1], max_files=16)) == 2


def test_a_large_state_is_split_into_balanced_files() -> None:
    sizes = [MiB] * 100  # 100 MiB: ceil(100 / 32) = 4 files of 25 leaves
    plan = files_mod.plan_files(sizes, max_files=16)
    assert [len(group) for group in plan] == [25, 25, 25, 25]
    assert sorted(i for group in plan for i in group) == list(range(100))


def test_never_more_files_than_max_files() -> None:
    sizes = [64 * MiB] * 40
    assert len(files_mod.plan_files(sizes, max_files=16)) == 16
    assert len(files_mod.plan_files(sizes, max_files=3)) == 3
    assert len(files_mod.plan_files(sizes, max_files=1)) == 1
    assert len(files_mod.plan_files(sizes[:5], max_files=16)) == 5  # one leaf per file at most


@pytest.mark.slow
@settings(deadline=None, max_examples=300)
@given(
    sizes=st.lists(st.integers(0, 200 * MiB) | st.integers(0, 4096), max_size=60),
    max_files=st.integers(1, 20),
    target=st.integers(1, 64 * MiB),
)
def test_plan_files_properties(sizes: list[int], max_files: int, target: int) -> None:
    plan = files_mod.plan_files(sizes, max_files=max_files, target=target)

    placed = [i for group in plan for i in group]
    assert sorted(placed) == list(range(len(sizes))), "every leaf placed exactly once"
    assert all(group == sorted(group) for group in plan), "leaf order kept within a file"
    assert all(plan), "no empty file"
    expected = (
        0 if not sizes else max(1, min(max_files, len(sizes), math.ceil(sum(sizes) / target)))
    )
    assert len(plan) == expected
    if len(plan) > 1:
        loads = _loads(plan, sizes)
        # Greedy largest-first: no file exceeds another by more than one leaf.
        assert max(loads) - min(loads) <= max(sizes) + ALIGN


# --- offsets and alignment in a real save ----------------------------------------------------


def _odd_arrays() -> dict[str, np.ndarray]:
    """Sizes that are not multiples of 64, zero-size and 0-d leaves included."""
    rng = np.random.default_rng(0)
    return {
        "u8/1": np.array([7], dtype=np.uint8),
        "f64/0d": np.array(np.pi),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "i16/33": rng.integers(-100, 100, 33).astype(np.int16),
        "f32/100": rng.standard_normal(100).astype(np.float32),
        "bool/5": np.array([True, False, True, True, False]),
        "c64/3": (rng.standard_normal(3) + 1j).astype(np.complex64),
        "empty/last": np.zeros(0, dtype=np.int64),
    }


@pytest.mark.parametrize("files", [1, 3])
def test_offsets_are_aligned_and_leaves_do_not_overlap(
    store: CheckpointStore,
    run_config: dict[str, Any],
    split_into: SplitInto,
    assert_same: AssertSame,
    files: int,
) -> None:
    if files > 1:
        split_into(files)
    arrays = _odd_arrays()
    step_dir = store.save(1, arrays, run_config=run_config).path
    manifest = json.loads((step_dir / fmt.MANIFEST).read_bytes())

    names = [f["name"] for f in manifest["files"]]
    assert names == [fmt.data_file_name(i) for i in range(files)]
    assert sorted(p.name for p in step_dir.iterdir()) == sorted([*names, fmt.MANIFEST])
    for f in manifest["files"]:
        assert (step_dir / f["name"]).stat().st_size == f["nbytes"]
        leaves = sorted(
            (leaf for leaf in manifest["leaves"] if leaf["file"] == f["name"]),
            key=lambda leaf: (leaf["offset"], leaf["nbytes"]),
        )
        assert leaves, f"{f['name']} holds no leaf"
        end = 0
        for leaf in leaves:
            assert leaf["offset"] % ALIGN == 0, leaf
            assert leaf["offset"] >= end, f"{leaf['path']} overlaps the leaf before it"
            assert leaf["offset"] - end < ALIGN, "no more padding than alignment needs"
            end = leaf["offset"] + leaf["nbytes"]
        assert end <= f["nbytes"] < end + ALIGN
    assert [leaf["path"] for leaf in manifest["leaves"]] == list(arrays), "manifest in save order"

    loaded = store.load(1).arrays
    assert_same(loaded, arrays)
    assert list(loaded) == list(arrays)
    for name, arr in loaded.items():
        assert arr.flags.c_contiguous, name
        if arr.size:
            assert arr.ctypes.data % ALIGN == 0, f"{name} read back at a misaligned address"


def test_read_arrays_do_not_alias_each_other(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    arrays = {"a": np.arange(10, dtype=np.int64), "b": np.arange(10, dtype=np.int64) * 2}
    store.save(1, arrays, run_config=run_config)
    loaded = store.load(1).arrays
    loaded["a"][:] = -1
    np.testing.assert_array_equal(loaded["b"], arrays["b"])
    np.testing.assert_array_equal(store.load(1).arrays["a"], arrays["a"])  # disk untouched


def test_a_save_with_no_leaves_writes_no_data_file(
    store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    step_dir = store.save(1, {}, run_config=run_config).path
    assert sorted(p.name for p in step_dir.iterdir()) == [fmt.MANIFEST]
    manifest = store.load(1).manifest
    assert (manifest.files, manifest.leaves, manifest.total_bytes) == ((), (), 0)
    assert store.load(1).arrays == {}


def test_a_small_state_is_one_data_file(
    store: CheckpointStore,
    run_config: dict[str, Any],
    arrays_for: Callable[[int], dict[str, np.ndarray]],
) -> None:
    step_dir = store.save(1, arrays_for(1), run_config=run_config).path
    assert sorted(p.name for p in step_dir.iterdir()) == ["D00000.bin", fmt.MANIFEST]
    assert {leaf.file for leaf in store.load(1).manifest.leaves} == {"D00000.bin"}


@pytest.mark.slow
def test_a_large_state_is_written_as_several_files_and_restored(
    tmp_path: Path, run_config: dict[str, Any], assert_same: AssertSame
) -> None:
    """The real rule, unpatched: 80 MiB in 40 leaves is 3 files (ceil(80 / 32))."""
    rng = np.random.default_rng(1)
    arrays = {f"w/{i}": rng.standard_normal(MiB // 2 - i, dtype=np.float32) for i in range(40)}
    store = CheckpointStore(tmp_path / "ckpt")
    store.save(1, arrays, run_config=run_config)
    loaded = store.load(1)
    assert [f.name for f in loaded.manifest.files] == ["D00000.bin", "D00001.bin", "D00002.bin"]
    sizes = [f.nbytes for f in loaded.manifest.files]
    assert max(sizes) - min(sizes) <= 2 * MiB, sizes
    assert_same(loaded.arrays, arrays)
    for arr in loaded.arrays.values():
        assert arr.ctypes.data % ALIGN == 0


# --- write_packed / read_packed ---------------------------------------------------------------


def test_write_packed_reports_offsets_digests_and_size(tmp_path: Path) -> None:
    parts = [b"abc", b"", b"x" * 64, b"y" * 65, b"z"]
    placed, size = files_mod.write_packed(tmp_path / "D00000.bin", [memoryview(p) for p in parts])

    assert [offset for offset, _ in placed] == [0, 64, 64, 128, 256]
    assert [digest for _, digest in placed] == [xxhash.xxh3_128_hexdigest(p) for p in parts]
    assert size == 257
    data = (tmp_path / "D00000.bin").read_bytes()
    assert len(data) == size
    assert data == b"abc" + bytes(61) + b"x" * 64 + b"y" * 65 + bytes(63) + b"z"


def test_write_packed_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "D00000.bin").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        files_mod.write_packed(tmp_path / "D00000.bin", [memoryview(b"new")])
    assert (tmp_path / "D00000.bin").read_bytes() == b"keep"


def test_read_packed_reads_leaves_in_any_subset(tmp_path: Path) -> None:
    a = np.arange(5, dtype=np.int32)
    b = np.linspace(0, 1, 7)
    placed, size = files_mod.write_packed(
        tmp_path / "D00000.bin", [files_mod.as_bytes(a), files_mod.as_bytes(b)]
    )
    entry = fmt.FileEntry("D00000.bin", size)

    def leaf(path: str, arr: np.ndarray, i: int) -> fmt.LeafEntry:
        return fmt.LeafEntry(
            path, "D00000.bin", placed[i][0], arr.dtype.name, arr.shape, arr.nbytes, placed[i][1]
        )

    (got_b,) = files_mod.read_packed(tmp_path, entry, [leaf("b", b, 1)])
    np.testing.assert_array_equal(got_b, b)
    got = files_mod.read_packed(tmp_path, entry, [leaf("b", b, 1), leaf("a", a, 0)])
    np.testing.assert_array_equal(got[0], b)
    np.testing.assert_array_equal(got[1], a)
    with pytest.raises(ValueError, match=f"has {size} bytes, manifest says 999"):
        files_mod.read_packed(tmp_path, fmt.FileEntry("D00000.bin", 999), [])
    with pytest.raises(ValueError, match=r"D00001\.bin is missing"):
        files_mod.read_packed(tmp_path, fmt.FileEntry("D00001.bin", size), [])


def test_aligned_empty_is_aligned() -> None:
    assert files_mod.aligned_empty(0).nbytes == 0  # numpy may put a zero-size view anywhere
    for n in (1, 63, 64, 65, 4097):
        buf = files_mod.aligned_empty(n)
        assert buf.nbytes == n
        assert buf.ctypes.data % ALIGN == 0
