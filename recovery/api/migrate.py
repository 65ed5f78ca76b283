"""Migration from Orbax: an Orbax checkpoint becomes a verified checkpoint of ours.

Orbax itself reads the source (``orbax-checkpoint``, the ``orbax`` extra; tested with 0.12.8),
so every layout it can restore is read the way it wrote it:

* a single save (``StandardCheckpointer().save(path, state)``): a directory with ``_METADATA``;
* a ``CheckpointManager`` directory: one sub-directory per step (``7``, or ``<prefix>_7``),
  each holding one item directory per name (``default`` for a plain ``manager.save``; several
  for ``args.Composite``). Pytree items become the state; JSON items (``args.JsonSave``) go to
  the checkpoint's metadata under ``orbax_json``.

Each step is written with :class:`recovery.checkpoint.CheckpointStore` under the output's run
lock and then verified byte for byte before the next one is read.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recovery.checkpoint import CheckpointStore, RunLock
from recovery.checkpoint import format as fmt
from recovery.errors import CheckpointExistsError, UsageError

_PYTREE_MARK = "_METADATA"
_STEP_META = "_CHECKPOINT_METADATA"
_STEP_DIR = re.compile(r"^(?:.*_)?(\d+)$")
_JSON_HANDLER = "JsonCheckpointHandler"


@dataclass(frozen=True)
class Imported:
    """One Orbax step, now a verified checkpoint of ours."""

    step: int
    source: Path
    """The Orbax step (or single save) directory it came from."""
    leaves: int
    total_bytes: int
    state_digest: str


@dataclass(frozen=True)
class _Step:
    step: int
    path: Path
    items: dict[str, Path]
    """Pytree item name -> its directory ("" for a single save)."""
    json_items: dict[str, Path]


def import_orbax(
    source: Path | str,
    out: Path | str,
    *,
    step: int | None = None,
    item: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
) -> list[Imported]:
    """Convert the Orbax checkpoint at ``source`` into verified checkpoints under ``out``.

    Args:
        source: an Orbax ``CheckpointManager`` directory or a single save's directory.
        out: our checkpoint root (a run directory's ``checkpoints/``); it must not hold any of
            the steps imported.
        step: for a manager directory, import only this step; for a single save, the step
            number to give it (default 0).
        item: with several pytree items per step, import only this one (its leaves then
            have no ``item/`` prefix). One item is always imported without a prefix.
        run_config: the run configuration to store (default ``{}``): what your
            ``CheckpointManager(run_config=...)`` will restore with.

    Returns:
        One entry per step imported, ascending.
    Raises:
        UsageError: ``source`` is not an Orbax checkpoint, an unknown ``step`` or ``item``,
            or a leaf that is not an array or a number (the message names it).
        CheckpointExistsError: ``out`` already holds one of those steps.
        CheckpointDamaged: a written step failed verification (a disk problem).
    """
    source = Path(source)
    steps = _find_steps(source, step)
    store = CheckpointStore(Path(out), clock=clock)
    clash = sorted({s.step for s in steps} & set(store.steps()))
    if clash:
        raise CheckpointExistsError(
            f"{store.root} already holds step(s) {', '.join(map(str, clash))}; "
            "import into an empty directory"
        )
    done = []
    with RunLock(store.root).held():
        for s in steps:
            arrays, metadata = _read_step(s, item)
            metadata["imported_from"] = str(s.path.resolve())
            store.save(s.step, arrays, run_config=dict(run_config or {}), metadata=metadata)
            manifest = store.verify(s.step)
            done.append(
                Imported(
                    step=s.step,
                    source=s.path,
                    leaves=len(manifest.leaves),
                    total_bytes=manifest.total_bytes,
                    state_digest=fmt.state_digest(manifest.leaves),
                )
            )
    return done


def _find_steps(source: Path, step: int | None) -> list[_Step]:
    if not source.is_dir():
        raise UsageError(f"{source} is not a directory (give an Orbax checkpoint directory)")
    if (source / _PYTREE_MARK).is_file():  # a single save
        return [_Step(step or 0, source, {"": source}, {})]
    found = []
    for p in sorted(source.iterdir()):
        m = _STEP_DIR.match(p.name)
        if m is None or not p.is_dir() or "tmp" in p.name:
            continue  # not a step, or an unfinished save (.orbax-checkpoint-tmp-)
        found.append(_step_items(int(m.group(1)), p))
    found.sort(key=lambda s: s.step)
    if not found:
        raise UsageError(
            f"{source} is not an Orbax checkpoint: no {_PYTREE_MARK} file (a single save) and "
            "no step directories (a CheckpointManager directory)"
        )
    if step is None:
        return found
    chosen = [s for s in found if s.step == step]
    if not chosen:
        known = ", ".join(str(s.step) for s in found)
        raise UsageError(f"Unknown step {step} in {source}. Known: {known}")
    return chosen


def _step_items(step: int, path: Path) -> _Step:
    if (path / _PYTREE_MARK).is_file():  # an item saved directly in the step directory
        return _Step(step, path, {"": path}, {})
    handlers: dict[str, str] = {}
    meta = path / _STEP_META
    if meta.is_file():
        handlers = json.loads(meta.read_text()).get("item_handlers") or {}
    items, json_items = {}, {}
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        if (sub / _PYTREE_MARK).is_file():
            items[sub.name] = sub
        elif _JSON_HANDLER in str(handlers.get(sub.name, "")):
            json_items[sub.name] = sub
        else:
            raise UsageError(
                f"{sub}: item {sub.name!r} is neither a pytree nor JSON "
                f"(handler {handlers.get(sub.name, 'unknown')}); import-orbax reads those two"
            )
    if not items:
        raise UsageError(f"{path}: step {step} holds no pytree item")
    return _Step(step, path, items, json_items)


def _read_step(s: _Step, item: str | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(leaf path -> array, metadata)`` of one Orbax step."""
    items = s.items
    if item is not None:
        if item not in items:
            known = ", ".join(sorted(items))
            raise UsageError(f"Unknown item {item!r} in {s.path}. Known: {known}")
        items = {item: items[item]}
    single = len(items) == 1
    arrays: dict[str, np.ndarray] = {}
    for name, directory in items.items():
        prefix = "" if single else f"{name}/"
        for path, arr in _read_pytree(directory).items():
            arrays[prefix + path] = arr
    metadata: dict[str, Any] = {"orbax_step": s.step}
    if s.json_items:
        metadata["orbax_json"] = {
            name: json.loads((d / "metadata").read_text()) for name, d in s.json_items.items()
        }
    return arrays, metadata


def _read_pytree(directory: Path) -> dict[str, np.ndarray]:
    """Every leaf of the Orbax pytree save in ``directory`` as a host array, read by Orbax."""
    import jax
    import orbax.checkpoint as ocp

    from recovery.api import pytree

    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(directory)
    tree = getattr(getattr(metadata, "item_metadata", metadata), "tree", None)
    if tree is None:
        tree = getattr(metadata, "item_metadata", metadata)
    restore_args = jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree
    )
    state = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    return pytree.flatten(state, private=False).arrays
