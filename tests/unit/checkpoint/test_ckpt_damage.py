"""Each kind of damage is detected, named by its own reason, and skipped on restore."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.checkpoint import CheckpointStore
from recovery.checkpoint import files as files_mod
from recovery.checkpoint import format as fmt
from recovery.errors import (
    AllCheckpointsDamagedError,
    CheckpointDamaged,
    ConfigMismatchError,
    NoCheckpointError,
)

Commit = Callable[[int], Path]
SplitInto = Callable[[int], None]
AssertSame = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]


def _manifest(step_dir: Path) -> dict[str, Any]:
    return json.loads((step_dir / fmt.MANIFEST).read_bytes())  # type: ignore[no-any-return]


def _largest_leaf(step_dir: Path, file: str | None = None) -> dict[str, Any]:
    """The largest leaf of the step, or of one of its data files."""
    leaves = [x for x in _manifest(step_dir)["leaves"] if file in (None, x["file"])]
    return max(leaves, key=lambda leaf: leaf["nbytes"])


def _data_file(step_dir: Path, file: str | None = None) -> Path:
    """``file``, or else the data file that holds the largest leaf."""
    return step_dir / (file or _largest_leaf(step_dir)["file"])


def _edit_manifest(step_dir: Path, edit: Callable[[dict[str, Any]], None], *, reseal: bool) -> None:
    path = step_dir / fmt.MANIFEST
    manifest = json.loads(path.read_bytes())
    edit(manifest)
    if reseal:  # what a careless tool (or an attacker) would do: fix up the checksum
        manifest["manifest_checksum"] = fmt.manifest_checksum(manifest)
    path.write_bytes(fmt.canonical_json(manifest))


def truncate_file(d: Path, file: str | None = None) -> None:
    f = _data_file(d, file)
    f.write_bytes(f.read_bytes()[:-1])


def flip_byte(d: Path, file: str | None = None) -> None:
    """Flip one bit in the middle of the largest leaf (not in padding between leaves)."""
    leaf = _largest_leaf(d, file)
    f = d / leaf["file"]
    data = bytearray(f.read_bytes())
    data[leaf["offset"] + leaf["nbytes"] // 2] ^= 0x01
    f.write_bytes(bytes(data))


def missing_file(d: Path, file: str | None = None) -> None:
    _data_file(d, file).unlink()


def missing_manifest(d: Path) -> None:
    (d / fmt.MANIFEST).unlink()


def malformed_manifest(d: Path) -> None:
    (d / fmt.MANIFEST).write_bytes(b'{"format": "recover-checkpoint", "step": ')


def edited_digest(d: Path) -> None:
    def edit(m: dict[str, Any]) -> None:
        m["leaves"][0]["digest"] = "0" * 32

    _edit_manifest(d, edit, reseal=False)


def edited_step(d: Path) -> None:
    def edit(m: dict[str, Any]) -> None:
        m["step"] = 9

    _edit_manifest(d, edit, reseal=False)


def escaping_file_name(d: Path) -> None:
    # A target that would "verify" if followed: a copy of the real data file.
    (d.parent / "x").write_bytes(_data_file(d).read_bytes())

    def edit(m: dict[str, Any]) -> None:
        old = m["files"][0]["name"]
        m["files"][0]["name"] = "../x"
        for leaf in m["leaves"]:
            if leaf["file"] == old:
                leaf["file"] = "../x"

    _edit_manifest(d, edit, reseal=True)


def unknown_data_file(d: Path) -> None:
    # A well-formed name that the manifest's ``files`` does not list (and that exists).
    (d / "D00099.bin").write_bytes(_data_file(d).read_bytes())

    def edit(m: dict[str, Any]) -> None:
        m["leaves"][0]["file"] = "D00099.bin"

    _edit_manifest(d, edit, reseal=True)


DAMAGES: dict[str, tuple[Callable[[Path], None], list[str], str]] = {
    # name: (damage, distinctive fragments of the reason, state in scan)
    "truncated-file": (
        truncate_file,
        ["data file D0", "bytes, manifest says", "truncated"],
        "corrupt",
    ),
    "flipped-byte": (flip_byte, ["content digest mismatch", ".bin at byte"], "corrupt"),
    "missing-file": (missing_file, ["data file D0", "is missing"], "corrupt"),
    "missing-manifest": (missing_manifest, ["manifest.json missing"], "incomplete"),
    "malformed-manifest": (malformed_manifest, ["not valid JSON"], "corrupt"),
    "edited-digest": (edited_digest, ["manifest checksum mismatch"], "corrupt"),
    "edited-step": (edited_step, ["manifest says step 9", "directory is step 8"], "corrupt"),
    "escaping-file-name": (escaping_file_name, ["invalid data file", "'../x'"], "corrupt"),
    "unknown-data-file": (
        unknown_data_file,
        ["manifest leaf 0", "unknown data file", "'D00099.bin'"],
        "corrupt",
    ),
}


def _damage(name: str, commit: Commit) -> str:
    """Commit steps 4 and 8, damage step 8, and return the reason load() gives."""
    commit(4)
    step_dir = commit(8)
    DAMAGES[name][0](step_dir)
    return _reason_of(CheckpointStore(step_dir.parent), 8)


def _reason_of(store: CheckpointStore, step: int) -> str:
    with pytest.raises(CheckpointDamaged) as info:
        store.load(step)
    assert info.value.step == step
    assert f"step {step} is damaged" in str(info.value)
    return info.value.reason


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_damage_is_detected_with_its_own_reason(name: str, commit: Commit) -> None:
    reason = _damage(name, commit)
    for fragment in DAMAGES[name][1]:
        assert fragment in reason, (name, reason)
    # No other damage's fragments match: the reasons tell the damages apart.
    for other, (_, fragments, _) in DAMAGES.items():
        if other != name:
            assert not all(f in reason for f in fragments), (name, other, reason)


def test_every_damage_gives_a_different_reason(tmp_path: Path, run_config: dict[str, Any]) -> None:
    def committer(store: CheckpointStore) -> Commit:
        def commit(step: int) -> Path:
            arrays: dict[str, np.ndarray] = {
                "w": np.arange(64, dtype=np.float32) * step,
                "b": np.ones(3),
            }
            return store.save(step, arrays, run_config=run_config).path

        return commit

    reasons = {name: _damage(name, committer(CheckpointStore(tmp_path / name))) for name in DAMAGES}
    assert len(set(reasons.values())) == len(DAMAGES), reasons


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_restore_falls_back_to_the_older_intact_step(
    name: str,
    commit: Commit,
    store: CheckpointStore,
    run_config: dict[str, Any],
    arrays_for: Callable[[int], dict[str, np.ndarray]],
    assert_same: AssertSame,
) -> None:
    reason = _damage(name, commit)

    result = store.restore_latest(run_config=run_config)

    assert result.loaded.step == 4
    assert_same(result.loaded.arrays, arrays_for(4))
    assert result.fallbacks == [(8, reason)]


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_scan_reports_the_state_and_reason(
    name: str, commit: Commit, store: CheckpointStore, clock: Any
) -> None:
    reason = _damage(name, commit)
    clock.now += 60.0

    rows = store.scan()

    assert [(r.name, r.step) for r in rows] == [("step_00000008", 8), ("step_00000004", 4)]
    damaged, intact = rows
    assert (damaged.state, damaged.reason) == (DAMAGES[name][2], reason)
    assert (intact.state, intact.reason) == ("intact", "")
    assert intact.age_s == pytest.approx(60.0)
    assert intact.size_bytes > 0


def test_shallow_scan_checks_sizes_but_not_content(commit: Commit, store: CheckpointStore) -> None:
    commit(4)
    flip_byte(commit(8))
    truncate_file(commit(12))
    missing_file(commit(16))
    grown = _data_file(commit(20))
    grown.write_bytes(grown.read_bytes() + b"\0")

    shallow = {r.step: (r.state, r.reason) for r in store.scan(deep=False)}
    deep = {r.step: r.state for r in store.scan(deep=True)}

    assert {s: state for s, (state, _) in shallow.items()} == {
        20: "corrupt",
        16: "corrupt",
        12: "corrupt",
        8: "intact",
        4: "intact",
    }
    assert "is missing" in shallow[16][1]
    for step in (12, 20):
        assert "bytes, manifest says" in shallow[step][1], shallow[step]
    assert deep == {20: "corrupt", 16: "corrupt", 12: "corrupt", 8: "corrupt", 4: "intact"}


class _OpenSpy:
    """Stands in for ``os`` inside ``files``: records every path opened."""

    def __init__(self) -> None:
        self.opened: list[Path] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, *args: Any, **kwargs: Any) -> int:
        self.opened.append(Path(path))
        return os.open(path, *args, **kwargs)


@pytest.mark.parametrize("damage", [escaping_file_name, unknown_data_file])
def test_a_file_the_manifest_does_not_vouch_for_is_never_opened(
    commit: Commit,
    store: CheckpointStore,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
) -> None:
    commit(4)
    damage(commit(8))
    spy = _OpenSpy()
    monkeypatch.setattr(files_mod, "os", spy)
    opened: list[Path] = []
    real_open = open

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy_open)

    with pytest.raises(CheckpointDamaged):
        store.load(8)
    assert spy.opened == []
    assert not any(p.name in ("x", "D00099.bin") for p in opened)
    # The spy sees the reads of an intact step, so the check above can fail.
    store.load(4)
    assert [p.name for p in spy.opened] == ["D00000.bin"]


def test_changed_run_config_names_fields_and_both_values(
    commit: Commit, store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    commit(4)
    commit(8)
    changed = {**run_config, "lr": 1e-3, "batch": 64, "new_flag": True}

    with pytest.raises(ConfigMismatchError) as info:
        store.restore_latest(run_config=changed)

    err = info.value
    assert err.step == 8  # no silent fallback to an older step of a different run
    assert err.differences == [("batch", 32, 64), ("lr", 3e-4, 1e-3), ("new_flag", None, True)]
    text = str(err)
    assert "batch: checkpoint has 32, this run has 64" in text
    assert "lr: checkpoint has 0.0003, this run has 0.001" in text
    assert "new_flag: checkpoint has None, this run has True" in text
    assert "model" not in text
    with pytest.raises(ConfigMismatchError):
        store.load(4, run_config=changed)
    with pytest.raises(ConfigMismatchError):
        store.verify(4, run_config=changed)
    # Without a run configuration to compare, both steps verify.
    assert store.verify(4).step == 4


def test_config_key_order_does_not_matter(commit: Commit, store: CheckpointStore) -> None:
    commit(4)
    reordered = {"seed": 0, "batch": 32, "lr": 3e-4, "model": "tiny"}
    assert store.restore_latest(run_config=reordered).loaded.step == 4


def test_config_mismatch_lists_only_fields_that_really_differ(
    store: CheckpointStore, arrays_for: Callable[[int], dict[str, np.ndarray]]
) -> None:
    store.save(1, arrays_for(1), run_config={"mesh": (2, 4), "lr": 0.1})
    with pytest.raises(ConfigMismatchError) as info:
        store.restore_latest(run_config={"mesh": (2, 4), "lr": 0.2})
    assert info.value.differences == [("lr", 0.1, 0.2)]


def test_all_damaged_lists_each_step_with_its_reason(
    commit: Commit, store: CheckpointStore, run_config: dict[str, Any]
) -> None:
    missing_manifest(commit(2))
    flip_byte(commit(4))
    truncate_file(commit(8))

    with pytest.raises(AllCheckpointsDamagedError) as info:
        store.restore_latest(run_config=run_config)

    failures = info.value.failures
    assert [step for step, _ in failures] == [8, 4, 2]
    assert "truncated" in failures[0][1]
    assert "digest mismatch" in failures[1][1]
    assert "manifest.json missing" in failures[2][1]
    text = str(info.value)
    assert str(store.root) in text
    for step, reason in failures:
        assert f"step {step}: {reason}" in text


@pytest.mark.parametrize("make_dir", [False, True], ids=["absent-root", "empty-root"])
def test_no_checkpoint_at_all(
    store: CheckpointStore, run_config: dict[str, Any], make_dir: bool
) -> None:
    if make_dir:
        store.root.mkdir()
        (store.root / "notes.txt").write_text("not a checkpoint")
        (store.root / "step_12").mkdir()  # too few digits: not a step directory
    with pytest.raises(NoCheckpointError, match="holds no checkpoint"):
        store.restore_latest(run_config=run_config)
    assert store.steps() == []
    assert store.scan() == []


def test_set_aside_moves_a_damaged_step_out_of_the_way(
    commit: Commit, store: CheckpointStore, run_config: dict[str, Any], clock: Any
) -> None:
    commit(4)
    flip_byte(commit(8))

    moved = store.set_aside(8)

    assert moved.name == f".damaged-step_00000008-{int(clock.now)}"
    assert store.steps() == [4]
    result = store.restore_latest(run_config=run_config)
    assert (result.loaded.step, result.fallbacks) == (4, [])
    assert store.remove_leftovers() == []  # evidence is kept
    assert moved.is_dir()
    rows = {r.name: r for r in store.scan()}
    assert rows[moved.name].state == "corrupt"
    assert "set aside" in rows[moved.name].reason


def _resealed_edit_falls_back(
    commit: Commit,
    store: CheckpointStore,
    run_config: dict[str, Any],
    section: str,
    change: dict[str, Any],
    fragment: str,
) -> None:
    """Step 8 with ``change`` applied to its first ``section`` entry (checksum redone) must
    fail verification with ``fragment`` in the reason, and restore must fall back to 4."""
    commit(4)
    step_dir = store.step_path(8)
    store.save(8, {"a": np.arange(2, dtype=np.int64)}, run_config=run_config)

    def edit(m: dict[str, Any]) -> None:
        m[section][0].update(change)

    _edit_manifest(step_dir, edit, reseal=True)

    result = store.restore_latest(run_config=run_config)
    assert result.loaded.step == 4
    assert [step for step, _ in result.fallbacks] == [8]
    assert fragment in result.fallbacks[0][1], result.fallbacks


@pytest.mark.parametrize(
    ("leaf_edit", "fragment"),
    [
        ({"shape": ["x"]}, "invalid shape"),
        ({"shape": [True, 2]}, "invalid shape"),
        ({"shape": [-1, -2]}, "invalid shape"),
        ({"dtype": "object"}, "dtype 'object' cannot hold array data"),
        ({"dtype": ">i8"}, "dtype '>i8' cannot hold array data"),
        ({"dtype": "<U2"}, "cannot hold array data"),
        ({"dtype": "no-such-type"}, "unknown dtype"),
        ({"nbytes": -16}, "invalid nbytes"),
        ({"nbytes": 8}, "shape (2,) x int64 != 8 B"),
        ({"offset": -64}, "invalid offset"),
        ({"offset": True}, "invalid offset True"),
        ({"offset": 8}, "lie outside D00000.bin"),  # misaligned
        ({"offset": 1 << 20}, "lie outside D00000.bin"),  # past the end of the file
        ({"file": "D00001.bin"}, "unknown data file 'D00001.bin'"),
        ({"key_impl": 7}, "invalid key_impl 7"),
        ({"key_impl": ""}, "invalid key_impl ''"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "",
)
def test_resealed_manifest_with_invalid_leaf_fields_is_damage(
    commit: Commit,
    store: CheckpointStore,
    run_config: dict[str, Any],
    leaf_edit: dict[str, Any],
    fragment: str,
) -> None:
    _resealed_edit_falls_back(commit, store, run_config, "leaves", leaf_edit, fragment)


@pytest.mark.parametrize(
    ("file_edit", "fragment"),
    [
        ({"name": "../x"}, "invalid data file '../x'"),
        ({"name": "/etc/passwd"}, "invalid data file '/etc/passwd'"),
        ({"name": "D1.bin"}, "invalid data file 'D1.bin'"),
        ({"nbytes": -1}, "has an invalid size"),
        ({"nbytes": "16"}, "has an invalid size"),
        ({"nbytes": 17}, "has 16 bytes, manifest says 17"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "",
)
def test_resealed_manifest_with_invalid_file_entries_is_damage(
    commit: Commit,
    store: CheckpointStore,
    run_config: dict[str, Any],
    file_edit: dict[str, Any],
    fragment: str,
) -> None:
    _resealed_edit_falls_back(commit, store, run_config, "files", file_edit, fragment)


@pytest.mark.parametrize("damage", [flip_byte, truncate_file, missing_file])
def test_damage_in_any_of_several_data_files_names_that_file(
    tmp_path: Path,
    run_config: dict[str, Any],
    split_into: SplitInto,
    assert_same: AssertSame,
    damage: Callable[[Path, str], None],
) -> None:
    split_into(3)
    store = CheckpointStore(tmp_path / "ckpt")
    arrays = {f"x/{i}": np.arange(40 + i, dtype=np.float32) * i for i in range(7)}
    store.save(4, arrays, run_config=run_config)
    step_dir = store.save(8, arrays, run_config=run_config).path
    names = [f["name"] for f in _manifest(step_dir)["files"]]
    assert names == ["D00000.bin", "D00001.bin", "D00002.bin"]

    for name in names:
        copy = tmp_path / name
        shutil.copytree(step_dir, copy / step_dir.name)
        damage(copy / step_dir.name, name)

        with pytest.raises(CheckpointDamaged) as info:
            CheckpointStore(copy).load(8)
        reason = info.value.reason
        assert name in reason, reason
        assert not any(other in reason for other in names if other != name), reason
    assert_same(store.load(8).arrays, arrays)


def test_padding_between_leaves_is_zero_and_not_part_of_any_digest(
    store: CheckpointStore, run_config: dict[str, Any], assert_same: AssertSame
) -> None:
    arrays = {f"odd/{i}": np.arange(n, dtype=np.uint8) for i, n in enumerate([1, 3, 65, 7, 130])}
    step_dir = store.save(1, arrays, run_config=run_config).path
    manifest = _manifest(step_dir)
    (f,) = manifest["files"]
    data = bytearray((step_dir / f["name"]).read_bytes())
    used = bytearray(len(data))
    for leaf in manifest["leaves"]:
        used[leaf["offset"] : leaf["offset"] + leaf["nbytes"]] = b"\1" * leaf["nbytes"]
    padding = [i for i, u in enumerate(used) if not u]
    assert len(padding) > 100, "the odd sizes should leave gaps between leaves"
    assert all(data[i] == 0 for i in padding), "padding is written as zero bytes"

    for i in padding:
        data[i] = 0xFF
    (step_dir / f["name"]).write_bytes(bytes(data))

    assert_same(store.load(1).arrays, arrays)
    assert [r.state for r in store.scan()] == ["intact"]
