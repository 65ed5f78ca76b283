"""The on-disk checkpoint format: names, the manifest and its validation.

A checkpoint is one directory per step under a checkpoint root::

    <root>/step_00000008/
        manifest.json        written last; its presence marks a finished save
        D00000.bin           data file: raw little-endian leaf bytes (C order, no header),
        D00001.bin           each leaf at a 64-byte-aligned offset; big states use several

Every leaf is readable with numpy alone::

    np.fromfile(dir / leaf["file"], dtype=leaf["dtype"], count=math.prod(leaf["shape"]),
                offset=leaf["offset"]).reshape(leaf["shape"])

(``bfloat16`` and the other ML dtypes need ``import ml_dtypes`` first, which jax installs.)
The full description lives in ``docs/checkpoint-format.md``; keep the two in step.

Nothing here is ever unpickled: the manifest is JSON and leaves are raw bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

FORMAT_NAME = "recover-checkpoint"
FORMAT_VERSION = 1
DIGEST_ALGORITHM = "xxh3_128"
MANIFEST = "manifest.json"

STEP_DIR_RE = re.compile(r"^step_(\d{8,})$")
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
DAMAGED_PREFIX = ".damaged-"

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "format_version": int,
    "step": int,
    "created_unix": (int, float),
    "run_config": dict,
    "run_config_id": str,
    "metadata": dict,
    "digest_algorithm": str,
    "files": list,
    "leaves": list,
    "total_bytes": int,
    "manifest_checksum": str,
}
_LEAF_REQUIRED: dict[str, type] = {
    "path": str,
    "file": str,
    "offset": int,
    "dtype": str,
    "shape": list,
    "nbytes": int,
    "digest": str,
}
_DATA_FILE_RE = re.compile(r"^D\d{5,}\.bin$")


def data_file_name(index: int) -> str:
    return f"D{index:05d}.bin"


def step_dir_name(step: int) -> str:
    """Directory name of a step: zero-padded so that names sort like numbers."""
    return f"step_{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """Step number of a committed checkpoint directory name, or None for anything else."""
    m = STEP_DIR_RE.match(name)
    return int(m.group(1)) if m else None


def new_hasher() -> Any:
    """A fresh streaming hasher of the format's digest algorithm (xxh3-128)."""
    return xxhash.xxh3_128()


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no whitespace) used for identities and checksums."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def config_identity(run_config: Mapping[str, Any]) -> str:
    """Digest of a run configuration; two runs with equal identity produce the same trajectory."""
    return str(xxhash.xxh3_128_hexdigest(canonical_json(dict(run_config))))


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """Checksum over every manifest field except the checksum itself."""
    body = {k: v for k, v in manifest.items() if k != "manifest_checksum"}
    return str(xxhash.xxh3_128_hexdigest(canonical_json(body)))


@dataclass(frozen=True)
class LeafEntry:
    """One array of the saved state, as the manifest records it."""

    path: str
    """Key path of the leaf in the state tree, e.g. ``params/layers/0/w``."""
    file: str
    """Data file (inside the step directory) that holds the leaf."""
    offset: int
    """Byte offset of the leaf in that file; a multiple of 64."""
    dtype: str
    """numpy dtype name (``float32``, ``bfloat16``, ...); bytes are little-endian."""
    shape: tuple[int, ...]
    """Array shape; the file holds ``prod(shape) * itemsize`` bytes in C order."""
    nbytes: int
    """Bytes of the leaf: ``prod(shape) * itemsize``."""
    digest: str
    """xxh3-128 of the leaf's bytes, 32 lowercase hex digits."""
    key_impl: str | None = None
    """For an array of JAX typed PRNG keys (``jax.random.key``): the key implementation
    (``threefry2x32``, ``rbg``, ...), the bytes being the keys' ``jax.random.key_data``;
    None for any other array. Optional in the manifest, so that a manifest without keys is
    what it was before keys could be saved."""

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "path": self.path,
            "file": self.file,
            "offset": self.offset,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "digest": self.digest,
        }
        if self.key_impl is not None:
            entry["key_impl"] = self.key_impl
        return entry


@dataclass(frozen=True)
class FileEntry:
    """One data file of a checkpoint."""

    name: str
    nbytes: int
    """Exact size: a different size means truncation or overwrite."""


@dataclass(frozen=True)
class Manifest:
    """A validated manifest."""

    step: int
    created_unix: float
    run_config: dict[str, Any]
    run_config_id: str
    metadata: dict[str, Any]
    files: tuple[FileEntry, ...]
    leaves: tuple[LeafEntry, ...]
    total_bytes: int


def build_manifest(
    *,
    step: int,
    created_unix: float,
    run_config: Mapping[str, Any],
    metadata: Mapping[str, Any],
    files: list[FileEntry],
    leaves: list[LeafEntry],
) -> dict[str, Any]:
    """The JSON object written as ``manifest.json``, checksum included."""
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": step,
        "created_unix": created_unix,
        "run_config": dict(run_config),
        "run_config_id": config_identity(run_config),
        "metadata": dict(metadata),
        "digest_algorithm": DIGEST_ALGORITHM,
        "files": [{"name": f.name, "nbytes": f.nbytes} for f in files],
        "leaves": [leaf.to_json() for leaf in leaves],
        "total_bytes": sum(leaf.nbytes for leaf in leaves),
    }
    manifest["manifest_checksum"] = manifest_checksum(manifest)
    return manifest


class ManifestInvalid(Exception):
    """Internal: the manifest fails a check; the message is the reason shown to users."""


def parse_manifest(raw: bytes, *, dir_step: int) -> Manifest:
    """Validate manifest bytes read from the directory of step ``dir_step``.

    The checks run in a fixed order so that each kind of damage gets its own reason:
    malformed JSON, missing or mistyped fields, unknown format/version, a step that does
    not match the directory, and finally the checksum (any other edit).

    Raises:
        ManifestInvalid: with a one-line reason.
    """
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestInvalid(f"manifest is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ManifestInvalid("manifest is not a JSON object")
    # Format and version first: another version may lay out its fields differently.
    if obj.get("format") != FORMAT_NAME:
        raise ManifestInvalid(f"manifest format is {obj.get('format')!r}, expected {FORMAT_NAME!r}")
    if obj.get("format_version") != FORMAT_VERSION:
        raise ManifestInvalid(
            f"manifest format_version {obj.get('format_version')!r} is not supported "
            f"(this version reads {FORMAT_VERSION})"
        )
    for key, typ in _REQUIRED.items():
        if key not in obj:
            raise ManifestInvalid(f"manifest lacks field {key!r}")
        if not isinstance(obj[key], typ) or isinstance(obj[key], bool):
            raise ManifestInvalid(f"manifest field {key!r} has the wrong type")
    if obj["step"] != dir_step:
        raise ManifestInvalid(
            f"manifest says step {obj['step']} but the directory is step {dir_step} "
            "(step edited or directory renamed)"
        )
    if obj["digest_algorithm"] != DIGEST_ALGORITHM:
        raise ManifestInvalid(f"unknown digest algorithm {obj['digest_algorithm']!r}")
    if obj["manifest_checksum"] != manifest_checksum(obj):
        raise ManifestInvalid(
            "manifest checksum mismatch: the manifest was modified after it was written"
        )
    files: dict[str, FileEntry] = {}
    for i, f in enumerate(obj["files"]):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ManifestInvalid(f"manifest file entry {i} is not valid")
        if not _DATA_FILE_RE.match(f["name"]):
            # Guards against a path that escapes the directory.
            raise ManifestInvalid(f"manifest names an invalid data file {f['name']!r}")
        if type(f.get("nbytes")) is not int or f["nbytes"] < 0:
            raise ManifestInvalid(f"manifest data file {f['name']} has an invalid size")
        files[f["name"]] = FileEntry(f["name"], f["nbytes"])
    leaves = []
    for i, leaf in enumerate(obj["leaves"]):
        if not isinstance(leaf, dict):
            raise ManifestInvalid(f"manifest leaf {i} is not an object")
        for key, typ in _LEAF_REQUIRED.items():
            if not isinstance(leaf.get(key), typ):
                raise ManifestInvalid(f"manifest leaf {i} lacks a valid {key!r}")
        if not all(type(d) is int and d >= 0 for d in leaf["shape"]):
            raise ManifestInvalid(f"manifest leaf {i} has an invalid shape {leaf['shape']!r}")
        for key in ("nbytes", "offset"):
            if type(leaf[key]) is not int or leaf[key] < 0:
                raise ManifestInvalid(f"manifest leaf {i} has an invalid {key} {leaf[key]!r}")
        if leaf["file"] not in files:
            raise ManifestInvalid(f"manifest leaf {i} names an unknown data file {leaf['file']!r}")
        key_impl = leaf.get("key_impl")
        if key_impl is not None and not (isinstance(key_impl, str) and key_impl):
            raise ManifestInvalid(f"manifest leaf {i} has an invalid key_impl {key_impl!r}")
        leaves.append(
            LeafEntry(
                path=leaf["path"],
                file=leaf["file"],
                offset=leaf["offset"],
                dtype=leaf["dtype"],
                shape=tuple(int(d) for d in leaf["shape"]),
                nbytes=leaf["nbytes"],
                digest=leaf["digest"],
                key_impl=key_impl,
            )
        )
    if obj["run_config_id"] != config_identity(obj["run_config"]):
        raise ManifestInvalid("manifest run_config_id does not match its run_config")
    return Manifest(
        step=obj["step"],
        created_unix=float(obj["created_unix"]),
        run_config=obj["run_config"],
        run_config_id=obj["run_config_id"],
        metadata=obj["metadata"],
        files=tuple(files.values()),
        leaves=tuple(leaves),
        total_bytes=obj["total_bytes"],
    )


def config_differences(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """Fields whose values differ, as ``(field, saved, current)``; missing values are None.

    ``current`` is compared in its JSON form (a tuple equals the list it is saved as).
    """
    current = json.loads(canonical_json(dict(current)))
    keys = sorted(set(saved) | set(current))
    return [(k, saved.get(k), current.get(k)) for k in keys if saved.get(k) != current.get(k)]


def state_digest(leaves: Iterable[LeafEntry]) -> str:
    """Digest of a whole saved state: every leaf's path, dtype, shape and content digest,
    and the key implementation of a leaf of PRNG keys (two key implementations with the
    same key data are different states; a state without keys digests as it always did).

    Two states are bit-identical exactly when their digests match; computing it costs no
    extra pass over the data because leaf digests are taken while writing or verifying.
    """
    rows = [
        [leaf.path, leaf.dtype, list(leaf.shape), leaf.digest]
        + ([] if leaf.key_impl is None else [leaf.key_impl])
        for leaf in leaves
    ]
    return str(xxhash.xxh3_128_hexdigest(canonical_json(rows)))


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """:func:`state_digest` of ``arrays`` held in memory (path -> array, in the order they
    would be saved): equal to the digest of their checkpoint, without writing one (for a
    state without PRNG keys: a leaf of keys adds its implementation, which plain arrays do
    not carry)."""
    rows = []
    for path, a in arrays.items():
        data = np.asarray(a)  # (np.ascontiguousarray would make a scalar one-dimensional)
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        content = xxhash.xxh3_128_hexdigest(flat.data)
        rows.append([path, data.dtype.name, list(data.shape), content])
    return str(xxhash.xxh3_128_hexdigest(canonical_json(rows)))
