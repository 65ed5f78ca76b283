"""Low-level I/O of checkpoint data files: packed leaves, hashed while written, fsynced.

Leaves are packed into a few data files (``D00000.bin``, ...) rather than one file each:
every file costs an ``fsync`` and a journal commit, which dominates small saves (200 leaves of
a 10 MiB state: 0.2 s as 200 files, a few milliseconds as one). Each leaf starts on a
:data:`ALIGN`-byte boundary so that arrays read back can be adopted by JAX without a copy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import heapq
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recovery import fsutil
from recovery.checkpoint import format as fmt

ALIGN = 64
"""Bytes; alignment of every leaf inside a data file and of arrays read back."""
WRITE_CHUNK = 64 * 1024 * 1024
"""Bytes per ``write`` call: bounded so hashing one chunk overlaps the kernel copying another."""
READ_CHUNK = 8 * 1024 * 1024
"""Bytes per ``preadv``; small enough that the chunk is still in cache when it is hashed."""
FILE_TARGET = 32 * 1024 * 1024
"""Bytes per data file before the state is split over more files (written in parallel)."""

_ZEROS = bytes(ALIGN)


def dtype_from_name(name: str) -> np.dtype[Any]:
    """numpy dtype for a manifest dtype name, ML dtypes (bfloat16, float8_*) included.

    Raises:
        TypeError: unknown name.
    """
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # registered by jax's own dependency

        try:
            return np.dtype(getattr(ml_dtypes, name))  # type: ignore[no-any-return]
        except AttributeError:
            raise TypeError(f"unknown dtype {name!r}") from None


def storable(dtype: np.dtype[Any]) -> bool:
    """Whether arrays of ``dtype`` round-trip through a checkpoint (plain numeric data)."""
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        return False
    try:
        return dtype_from_name(dtype.name) == dtype.newbyteorder("=")
    except TypeError:
        return False


def as_bytes(arr: np.ndarray) -> memoryview:
    """A flat byte view of ``arr`` in C order and little-endian, copying only when needed."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.reshape(-1).view(np.uint8).data


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised byte array whose data starts on an :data:`ALIGN` boundary.

    jax's CPU backend adopts a host array without copying only when it is 64-byte aligned;
    numpy's allocator guarantees 16. Aligning makes ``tree.from_host`` free on CPU.
    """
    buf = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -buf.ctypes.data % ALIGN
    return buf[start : start + nbytes]


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return getattr(libc, "renameat2", None)  # glibc >= 2.28


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False, having changed nothing, where the C library or the filesystem does not
    support it; the caller then falls back to two renames.

    Raises:
        OSError: any other failure of the system call.
    """
    fn = _renameat2()
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(err, os.strerror(err), str(a))


def plan_files(
    sizes: Sequence[int], *, max_files: int, target: int = FILE_TARGET, min_files: int = 1
) -> list[list[int]]:
    """Assign leaves (by index) to data files: about ``target`` bytes each, at most
    ``max_files`` files but at least ``min_files`` (one per writing process) where there
    are that many leaves, sizes balanced so parallel writers finish together. Within a file
    leaves keep their original order. No leaves: no files."""
    if not sizes:
        return []
    n = max(1, min(max_files, len(sizes), math.ceil(sum(sizes) / target)))
    n = max(n, min(min_files, len(sizes)))
    heap = [(0, f) for f in range(n)]
    bins: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        load, f = heapq.heappop(heap)
        bins[f].append(i)
        heapq.heappush(heap, (load + sizes[i] + ALIGN, f))
    return [sorted(b) for b in bins if b]


def write_packed(path: Path, parts: Sequence[memoryview]) -> tuple[list[tuple[int, str]], int]:
    """Write ``parts`` into a new file, each at an aligned offset, then fsync it.

    Each part is hashed as it is written (no second read).

    Returns:
        ``([(offset, digest) per part], file size in bytes)``.
    Raises:
        OSError: the file exists already, or the disk failed; the file is left as it is.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    placed: list[tuple[int, str]] = []
    pos = 0
    try:
        for data in parts:
            pad = -pos % ALIGN
            if pad:
                fsutil.write_all(fd, _ZEROS[:pad])
                pos += pad
            hasher = fmt.new_hasher()
            for start in range(0, len(data), WRITE_CHUNK):
                chunk = data[start : start + WRITE_CHUNK]
                hasher.update(chunk)
                fsutil.write_all(fd, chunk)
            placed.append((pos, str(hasher.hexdigest())))
            pos += len(data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return placed, pos


def read_packed(
    directory: Path,
    file: fmt.FileEntry,
    leaves: Sequence[fmt.LeafEntry],
    buffers: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Read one data file and verify the ``leaves`` stored in it (in the order given).

    ``buffers`` (one :func:`aligned_empty` of ``leaf.nbytes`` per leaf) receive the bytes;
    allocate them on the calling thread when reading from worker threads: glibc gives each
    thread its own arena, whose big blocks go back to the kernel when freed, so a restore on
    worker-allocated memory pays page faults and zeroing (as much as the read) every time.

    Raises:
        ValueError: with the reason, on a missing or resized file, a dtype or shape that does
            not fit, or a content digest mismatch.
    """
    if buffers is None:
        buffers = [aligned_empty(leaf.nbytes) for leaf in leaves]
    try:
        fd = os.open(os.path.join(directory, file.name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"data file {file.name} is missing") from None
    try:
        size = os.fstat(fd).st_size
        if size != file.nbytes:
            raise ValueError(
                f"data file {file.name} has {size} bytes, manifest says {file.nbytes} "
                "(truncated or overwritten)"
            )
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead from disk
        return [_read_leaf(fd, file, leaf, buf) for leaf, buf in zip(leaves, buffers, strict=True)]
    finally:
        os.close(fd)


def _read_leaf(fd: int, file: fmt.FileEntry, leaf: fmt.LeafEntry, buf: np.ndarray) -> np.ndarray:
    try:
        dtype = dtype_from_name(leaf.dtype)
    except TypeError as e:
        raise ValueError(f"leaf {leaf.path}: {e}") from None
    if not storable(dtype) or dtype.name != leaf.dtype:
        raise ValueError(f"leaf {leaf.path}: dtype {leaf.dtype!r} cannot hold array data")
    if math.prod(leaf.shape) * dtype.itemsize != leaf.nbytes:
        raise ValueError(f"leaf {leaf.path}: shape {leaf.shape} x {dtype} != {leaf.nbytes} B")
    end = leaf.offset + leaf.nbytes
    if leaf.offset % ALIGN or end > file.nbytes:
        raise ValueError(f"leaf {leaf.path}: bytes {leaf.offset}..{end} lie outside {file.name}")
    if buf.nbytes != leaf.nbytes:
        raise ValueError(f"leaf {leaf.path}: buffer of {buf.nbytes} B for {leaf.nbytes} B")
    view = buf.data
    hasher = fmt.new_hasher()
    pos = 0
    while pos < leaf.nbytes:
        n = os.preadv(fd, [view[pos : pos + READ_CHUNK]], leaf.offset + pos)
        if not n:
            raise ValueError(f"data file {file.name} ended early at byte {leaf.offset + pos}")
        hasher.update(view[pos : pos + n])
        pos += n
    if hasher.hexdigest() != leaf.digest:
        raise ValueError(
            f"leaf {leaf.path} ({file.name} at byte {leaf.offset}) content digest mismatch "
            "(bytes changed on disk)"
        )
    return buf.view(dtype).reshape(leaf.shape)
