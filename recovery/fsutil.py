"""Small state files: durable writes (the one home of fsync ordering for small files and
directories) and the one way to read a JSON state file back (:func:`read_json`).

A rename or a file creation is durable only once the directory holding the entry is
fsynced, and a renamed file's bytes only if the file itself was fsynced before the rename.
Getting either order wrong loses data on power loss, never on a mere crash, so tests prove
it by tracing ``os`` (``tests/unit/test_fsutil.py``) rather than by killing processes.

Every function looks ``os`` up on this module, so a test may stand in for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from recovery.errors import RecoverError

T = TypeVar("T")


def fsync_dir(path: Path | str) -> None:
    """Make a directory's entries (creations, renames, deletions) durable.

    Raises:
        OSError: the directory cannot be opened or the disk failed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: memoryview | bytes) -> None:
    """``os.write`` until every byte of ``data`` is written (a write may be short).

    Raises:
        OSError: the disk failed; what was written before stays.
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_new(path: Path | str, data: bytes) -> None:
    """Create ``path`` (which must not exist), write ``data`` and fsync the file.

    The directory entry is not made durable: fsync the directory (:func:`fsync_dir`) or
    rename the file into place with :func:`atomic_write`.

    Raises:
        FileExistsError: ``path`` exists already (it is left as it is).
        OSError: the disk failed; a partly written file may remain.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash or power loss leaves the old content or
    the new one, never a mix, and the new one survives power loss once this returns.

    Order: write a temporary sibling (same directory, so the rename stays on one file
    system) and fsync it, rename it over ``path``, fsync the directory.

    Raises:
        OSError: the write, the rename or a fsync failed; ``path`` is unchanged (or already
            replaced, if only the final directory fsync failed) and the temporary file is
            removed.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        write_new(tmp, data)
        os.rename(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def read_json(
    path: Path | str, parse: Callable[[Any], T], *, error: type[RecoverError] = RecoverError
) -> T | None:
    """The JSON state file ``path`` (where a daemon listens, the pids a start recorded), as
    ``parse`` makes it of the decoded document; None when there is no such file.

    Raises ``error`` naming the file when it cannot be read, is not JSON, or ``parse`` rejects
    what it holds (a missing field: KeyError; a wrong type or value: TypeError, ValueError).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise error(f"cannot read {p}: {e}") from e
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise error(f"cannot read {p}: not JSON ({e})") from e
    try:
        return parse(doc)
    except KeyError as e:
        raise error(f"cannot read {p}: no field {e} in it") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise error(f"cannot read {p}: unexpected content ({e})") from e
