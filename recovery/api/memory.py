"""The memory tier: each process keeps a verified copy of the newest state in node-local
memory, and a relaunched job takes its state from a surviving node instead of the durable
checkpoint.

Where the copy lives: ``ROOT/<node>/<run key>/<run id>/slot-{0,1}.bin``, ``ROOT`` being a
tmpfs (``/dev/shm/slurm-k8s-recover-<uid>`` by default), ``<node>`` the Slurm node name
(``SLURMD_NODENAME``, else the host name), ``<run key>`` a digest of the run directory's path
and ``<run id>`` the id a fresh start writes to ``RUN_DIR/run-id`` (so a run started again in
a directory of the same name never takes an older run's copies). The node name is part of the
path so that the simulated nodes of a local cluster, which share one host, never see each
other's copies: a process started on a spare finds nothing, as on a real spare node. Copies of
other run ids are removed when the tier starts, and the run's own when it completes.

A slot file (:func:`slot_bytes`): ``RCVMEM1\n``, the header's length (8 bytes, little
endian), the header (JSON: step, state digest, the run configuration's identity, the process
count, per leaf its path, dtype, shape, offset, size and xxh3-128 digest), padding to 64
bytes, then the leaves' bytes. Not the checkpoint format: a copy must cost next to nothing
(no directory, no manifest, no fsync - a node that loses power loses its tmpfs anyway), and
it is as well checked (:func:`read_slot` verifies every leaf and the state digest).

Saving (:class:`MemoryTier`): the state is copied to host memory and written to the older of
the two slots (a temporary file renamed over it, so the other slot is whole whatever
happens), in the loop: no thread competes with the training for the interpreter. Every
process copies after the same step: process 0 decides (:meth:`MemoryTier.due`) and its wish
travels with the stop vote every process already exchanges each step
(:class:`recovery.api.ranks.StopVote`); copies at different steps would make each process
wait, in the next collective, for every other's copy. Process 0 keeps the tier within
:data:`BUDGET` of the wall time: after a copy that took ``c`` seconds, the next is no sooner
than ``c / BUDGET`` seconds later (and no sooner than ``every`` steps). With steps of a
tenth of a second (every scenario) that is every step; with mlp-tiny's 3.6 ms steps on two
cores, about every 20 steps (a copy costs some 1.5 ms there).

Restoring (:func:`restore_from_memory`, a collective of every process): each process verifies
its newest local copy; the processes agree on the newest step any of them holds; when that is
not older than the newest durable checkpoint, the lowest process holding it sends it to the
others over JAX's collectives (the bytes as int32 words summed with zeros: exact), and every
process checks the state digest before using it. Any failure falls back to the durable
checkpoint, and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from recovery.checkpoint.files import dtype_from_name
from recovery.checkpoint.format import arrays_digest, canonical_json, config_identity
from recovery.contract.memplace import (
    DEFAULT_ROOT,
    ENV_MEMORY_DIR,
    environ_node_key,
    forget_node,
    local_dir,
    memory_root,
    node_key,
    node_name,
    private_root,
    read_run_id,
    run_id,
)
from recovery.errors import UsageError

__all__ = [
    "BUDGET",
    "DEFAULT_ROOT",
    "ENV_MEMORY_DIR",
    "KEEP",
    "STALE_S",
    "MemoryTier",
    "environ_node_key",
    "forget_node",
    "local_dir",
    "memory_root",
    "newest_local",
    "node_key",
    "node_name",
    "private_root",
    "read_run_id",
    "read_slot",
    "restore_from_memory",
    "run_id",
    "slot_bytes",
]

if TYPE_CHECKING:
    from recovery.multiproc import Group

#: Local copies kept per run and node.
KEEP = 2
#: Share of the wall time the tier may spend on copies (see the module docstring): half the
#: 5% it may cost, since a copy also costs the loop around it a little (caches, allocation).
BUDGET = 0.025


#: Seconds after which copies no run has written are removed from the node (a day: a run
#: requeued and pending that long restores from its durable checkpoint).
STALE_S = 86400.0


def _newest_mtime(directory: Path) -> float:
    """The newest modification time under ``directory`` (itself included)."""
    newest = 0.0
    for path in (directory, *directory.rglob("*")):
        try:
            newest = max(newest, path.stat().st_mtime)
        except OSError:
            continue
    return newest


#: First bytes of a slot file.
MAGIC = b"RCVMEM1\n"
_HEAD = struct.Struct("<8sQ")  # magic, header length
_ALIGN = 64


class SlotError(Exception):
    """A slot that cannot be used (missing, cut short, damaged, another run's)."""


def _data_start(header_size: int) -> int:
    return -(-(_HEAD.size + header_size) // _ALIGN) * _ALIGN


def slot_bytes(
    step: int, arrays: Mapping[str, np.ndarray], *, config_id: str, processes: int
) -> tuple[bytes, str]:
    """One slot file's content for ``arrays`` at ``step``, and their state digest: a header
    (JSON: step, digest, the run configuration's identity, the process count, and per leaf
    its path, dtype, shape, offset, size and digest), then the leaves' bytes."""
    leaves: list[list[Any]] = []
    views: list[np.ndarray] = []
    offset = 0
    for path, a in arrays.items():
        data = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        digest = xxhash.xxh3_128_hexdigest(data.data)
        leaves.append([path, a.dtype.name, list(a.shape), offset, data.nbytes, digest])
        views.append(data)
        offset += data.nbytes
    rows = [[p, d, shape, dg] for p, d, shape, _, _, dg in leaves]
    state = str(xxhash.xxh3_128_hexdigest(canonical_json(rows)))
    doc = {"step": step, "state_digest": state, "config": config_id, "processes": processes,
           "leaves": leaves}  # fmt: skip
    header = json.dumps(doc, separators=(",", ":")).encode()
    head = _HEAD.pack(MAGIC, len(header)) + header
    pad = b"\0" * (_data_start(len(header)) - len(head))
    return b"".join([head, pad, *(v.tobytes() for v in views)]), state


def read_slot(
    path: Path, *, config_id: str, processes: int
) -> tuple[int, str, dict[str, np.ndarray]]:
    """``(step, state digest, arrays)`` of the slot file at ``path``, every leaf checked
    against its digest. Raises SlotError saying why it cannot be used."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SlotError("no copy") from None
    if len(raw) < _HEAD.size:
        raise SlotError(f"{len(raw)} bytes: cut short")
    magic, size = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise SlotError("not a memory-tier copy (bad magic)")
    if len(raw) < _HEAD.size + size:
        raise SlotError(f"{len(raw)} bytes: cut short in its header")
    try:
        head = json.loads(raw[_HEAD.size : _HEAD.size + size])
        step, state = int(head["step"]), str(head["state_digest"])
        leaves = list(head["leaves"])
    except (ValueError, KeyError, TypeError) as e:
        raise SlotError(f"header unreadable ({e})") from None
    if head.get("config") != config_id:
        raise SlotError(f"step {step} belongs to another run configuration")
    if head.get("processes") != processes:
        raise SlotError(f"step {step} was kept by a run of {head.get('processes')} processes")
    data = memoryview(raw)[_data_start(size) :]
    arrays: dict[str, np.ndarray] = {}
    try:
        for leaf_path, dtype, shape, offset, nbytes, digest in leaves:
            chunk = data[offset : offset + nbytes]
            if len(chunk) != nbytes:
                raise SlotError(f"step {step}: leaf {leaf_path} cut short")
            if xxhash.xxh3_128_hexdigest(chunk) != digest:
                raise SlotError(f"step {step}: leaf {leaf_path} does not match its digest")
            arrays[leaf_path] = np.frombuffer(chunk, dtype=dtype_from_name(dtype)).reshape(shape)
    except (ValueError, TypeError) as e:
        raise SlotError(f"step {step}: a leaf entry is malformed ({e})") from None
    if arrays_digest(arrays) != state:
        raise SlotError(f"step {step}: the state digest does not match")
    return step, state, arrays


class MemoryTier:
    """Node-local copies of the state in two slot files written in turn (one complete copy
    stays while the other is replaced), each copy within the tier's time budget."""

    def __init__(
        self,
        directory: Path,
        *,
        every: int,
        run_config: Mapping[str, Any],
        processes: int,
        budget: float = BUDGET,
        on_error: Callable[[BaseException], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if every < 1:
            raise UsageError(f"--memory-every must be >= 1 to keep copies (got {every})")
        if not 0 < budget <= 1:
            raise UsageError(f"--memory-budget must be in (0, 1] (got {budget:g})")
        self.directory = directory
        self.every = every
        self.budget = budget
        self.config_id = config_identity(run_config)
        self.processes = processes
        self._on_error = on_error
        self._clock = clock
        self._wall_clock = wall_clock  # compared with files' modification times
        self._next_at = 0.0
        self._last_step = -(10**9)
        self._pending = False
        self._tried = False
        self._asked_at: float | None = None
        self._last_cost = 0.0
        self._slot = 0
        self.skipped = 0
        self.failed = 0
        self.copies = 0
        self.spent_s = 0.0
        """Seconds the loop spent on copies."""
        self._remove_other_runs()

    def slots(self) -> list[Path]:
        return [self.directory / f"slot-{i}.bin" for i in range(KEEP)]

    def _remove_other_runs(self) -> None:
        """Copies of earlier runs in a directory of the same name are of no use: free them.
        Nor are copies on this node that no run has written for :data:`STALE_S` (a run that
        ended elsewhere, or was given up): a tmpfs holds them in memory until the node
        reboots."""
        parent = self.directory.parent
        try:
            others = [p for p in parent.iterdir() if p.name != self.directory.name]
        except FileNotFoundError:
            others = []
        for other in others:
            shutil.rmtree(other, ignore_errors=True)
        try:
            runs = [p for p in parent.parent.iterdir() if p.name != parent.name]
        except FileNotFoundError:
            return
        now = self._wall_clock()
        for run in runs:
            if now - _newest_mtime(run) > STALE_S:
                shutil.rmtree(run, ignore_errors=True)

    def discard(self) -> None:
        """Remove this run's copies (it completed: nothing will restore them)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def due(self, step: int) -> bool:
        """Whether to ask for a copy after the coming step, within ``every`` and the budget
        (the loop asks process 0 each step; every process copies on its answer, one step
        later: :class:`recovery.api.ranks.StopVote`)."""
        now = self._clock()
        interval = now - self._asked_at if self._asked_at is not None else None
        self._asked_at = now
        if self._pending:
            # The copy asked for last time is made at the end of this step. Ask for the next
            # one too only when copies as dear as the last fit the budget at this pace (so a
            # copy can follow every step), else the copies would come every other step.
            return (
                self.every == 1
                and interval is not None
                and self._last_cost / self.budget <= interval
            )
        if step - self._last_step < self.every:
            return False
        # The copy asked for now is made two steps on (this step, then the one at whose end
        # the vote is read): compare that moment with when the budget allows the next copy.
        if now + 2 * (interval or 0.0) < self._next_at:
            self.skipped += 1
            return False
        self._pending = True  # until the copy it asks for is made
        return True

    def copy(self, step: int, state: Any) -> bool:
        """Copy ``state`` (at ``step``) to the older slot; whether it was written. Never
        raises for a write that fails: the durable checkpoints are the tier below, a failed
        copy is logged (``on_error``) and a later one tried."""
        from recovery.api import pytree

        self._pending = False
        started = self._clock()
        # A leaf of typed PRNG keys is kept as its key data; a leaf that is no array or
        # number raises UsageError naming it (a mistake in the loop, not a failed write).
        arrays = pytree.flatten(state, private=False).arrays
        try:
            content, _ = slot_bytes(
                step, arrays, config_id=self.config_id, processes=self.processes
            )
            self.directory.mkdir(parents=True, exist_ok=True)
            target = self.slots()[self._slot]
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(content)
            os.replace(tmp, target)  # the other slot stays whole meanwhile
        except OSError as e:
            self.failed += 1
            if self._on_error is not None:
                self._on_error(e)
            return False
        finally:
            spent = self._clock() - started
            self.spent_s += spent
            # The first copy also pays one-off costs (the directory, first-use allocations):
            # under load it took tens of milliseconds, which spaced the next ones by seconds.
            self._next_at = started + (spent / self.budget if self._tried else 0.0)
            self._tried = True
            self._last_cost = spent
            self._last_step = step
        self._slot = (self._slot + 1) % KEEP
        self.copies += 1
        return True

    def offer(self, step: int, state: Any) -> bool:
        """:meth:`copy` when :meth:`due` (one process deciding for itself)."""
        return self.due(step) and self.copy(step, state)


@dataclass(frozen=True)
class Held:
    """What one process found in its node-local memory."""

    step: int
    digest: str
    arrays: dict[str, np.ndarray] | None
    refused: list[tuple[str, str]]
    """Slots that could not be used: ``(file name, reason)`` (a missing one is not listed)."""


def newest_local(tier: MemoryTier) -> Held:
    """The newest slot that verifies (step -1 when none does)."""
    found: list[tuple[int, str, dict[str, np.ndarray]]] = []
    refused: list[tuple[str, str]] = []
    for path in tier.slots():
        try:
            found.append(read_slot(path, config_id=tier.config_id, processes=tier.processes))
        except SlotError as e:
            if str(e) != "no copy":
                refused.append((path.name, str(e)))
    if not found:
        return Held(-1, "", None, refused)
    step, digest, arrays = max(found, key=lambda f: f[0])
    return Held(step, digest, arrays, refused)


@dataclass(frozen=True)
class FromMemory:
    state: Any
    step: int
    digest: str
    holder: int
    """The process whose node sent the state."""
    holder_node: str
    local_step: int
    """The newest copy this process found on its own node (-1: none)."""
    seconds: float
    nbytes: int


def restore_from_memory(
    group: Group,
    template: Any,
    tier: MemoryTier,
    *,
    newest_durable: int,
    node: str,
    log: Callable[[str], None],
) -> FromMemory | str:
    """The state from the newest node-local copy any process holds, sent to every process
    and checked against its digest; or, when none can be used, why (the caller falls back
    to the durable checkpoint). A collective: every process calls it.
    """
    from recovery.api import pytree
    from recovery.checkpoint import tree

    t0 = time.perf_counter()
    try:
        held = newest_local(tier)
    except OSError as e:  # an unreadable tmpfs is this node's problem, never the job's
        held = Held(-1, "", None, [(str(tier.directory), f"cannot be read: {e}")])
    for name, reason in held.refused:
        log(f"recover: local copy {name} is not usable: {reason}")
    offers = group.allgather([held.step, held.digest, node], channel="memory")
    best = max(int(o[0]) for o in offers)
    if best < 0:
        return "no node holds a copy of the state in memory"
    if best < newest_durable:
        return (
            f"the newest copy in memory (step {best}) is older than checkpoint step "
            f"{newest_durable}"
        )
    holder = min(r for r, o in enumerate(offers) if int(o[0]) == best)
    digest, holder_node = str(offers[holder][1]), str(offers[holder][2])
    me = group.rank
    # What each leaf was kept as: a leaf of typed keys as its key data, a number as a 0-d
    # array. Keys come back with the template's implementation; a copy of keys of another
    # size is refused by the digest check below.
    items: list[tuple[str, Any]] = []
    key_impls: dict[str, str] = {}
    for path, leaf in tree.leaf_paths(template):
        if pytree.is_keys(leaf):
            key_impls[path], layout = pytree.key_layout(leaf)
            items.append((path, layout))
        else:
            items.append((path, leaf if hasattr(leaf, "dtype") else np.asarray(leaf)))
    arrays = _broadcast(items, held.arrays if me == holder else None, source=me == holder)
    got = arrays_digest(arrays)
    ok = group.allgather(got == digest, channel="memory")
    if not all(ok):
        bad = [r for r, good in enumerate(ok) if not good]
        return (
            f"the copy of step {best} sent by process {holder} ({holder_node}) did not match "
            f"its digest on process(es) {', '.join(map(str, bad))}"
        )
    state = pytree.unflatten(template, arrays, key_impls)
    return FromMemory(
        state,
        best,
        digest,
        holder,
        holder_node,
        held.step,
        time.perf_counter() - t0,
        sum(a.nbytes for a in arrays.values()),
    )


def _broadcast(
    items: list[tuple[str, Any]], arrays: dict[str, np.ndarray] | None, *, source: bool
) -> dict[str, np.ndarray]:
    """Every leaf of the source's ``arrays`` on every process, bit for bit: the bytes packed
    into int32 words and summed with the other processes' zeros (exact, unlike a float sum,
    which would turn -0.0 into 0.0), cut into leaves as ``items`` (the template) says. A
    source whose leaves do not fit the template sends zeros: the digest check then refuses
    them everywhere, and nobody is left waiting in the collective."""
    from jax.experimental import multihost_utils

    sizes = [int(np.prod(np.shape(t))) * np.dtype(t.dtype).itemsize for _, t in items]
    total = sum(sizes)
    words = np.zeros((total + 3) // 4, dtype=np.int32)
    if source:
        assert arrays is not None
        buf = words.view(np.uint8)
        at = 0
        for (path, _), size in zip(items, sizes, strict=True):
            leaf = arrays.get(path)
            if leaf is None or leaf.nbytes != size:
                words[:] = 0
                break
            buf[at : at + size] = np.ascontiguousarray(leaf).reshape(-1).view(np.uint8)
            at += size
    out = np.asarray(multihost_utils.broadcast_one_to_all(words, is_source=source))
    raw = out.view(np.uint8)
    result: dict[str, np.ndarray] = {}
    at = 0
    for (path, t), size in zip(items, sizes, strict=True):
        dtype = np.dtype(t.dtype)
        result[path] = raw[at : at + size].view(dtype).reshape(np.shape(t)).copy()
        at += size
    return result
