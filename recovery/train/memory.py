"""The memory tier: each process keeps a verified copy of the newest state in node-local
memory, and a relaunched job takes its state from a surviving node instead of the durable
checkpoint.

Where the copy lives: ``ROOT/<node>/<run key>/<run id>/step_N/`` in the checkpoint format
(manifest, digests; :mod:`recovery.checkpoint`), ``ROOT`` being a tmpfs
(``/dev/shm/slurm-k8s-recover`` by default), ``<node>`` the Slurm node name
(``SLURMD_NODENAME``, else the host name), ``<run key>`` a digest of the run directory's path
and ``<run id>`` the id a fresh start writes to ``RUN_DIR/run-id`` (so a run started again in
a directory of the same name never takes an older run's copies). The node name is part of the
path so that the simulated nodes of a local cluster, which share one host, never see each
other's copies: a process started on a spare finds nothing, as on a real spare node. The
newest two steps are kept; copies of other run ids are removed when the tier starts, and the
run's own when it completes.

Saving (:class:`MemoryTier`): after every ``every``-th step the state goes to host memory and
a background thread writes it; a copy still being written when the next is due makes the
tier skip that step rather than wait, so the loop never blocks on it. The tier also keeps to
a budget of :data:`BUDGET` of the wall time: after a copy that took ``c`` seconds, the next
starts no sooner than ``c / BUDGET`` seconds later. With steps of a tenth of a second or more
that is every step; with steps of a few milliseconds (a copy costs about 4 ms on a 2-core
machine, mostly fixed costs) it is every few tens of steps, a few tens of milliseconds of
work to redo.

Restoring (:func:`restore_from_memory`, a collective of every process): each process verifies
its newest local copy; the processes agree on the newest step any of them holds; when that is
not older than the newest durable checkpoint, the lowest process holding it sends it to the
others over JAX's collectives (the bytes as int32 words summed with zeros: exact), and every
process checks the state digest before using it. Any failure falls back to the durable
checkpoint, and says why.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recovery.checkpoint import CheckpointStore, RetentionPolicy
from recovery.checkpoint.format import arrays_digest
from recovery.errors import CheckpointError, UsageError

if TYPE_CHECKING:
    from recovery.train.loop import Run

#: Where node-local copies go unless ``--memory-dir`` / ``RECOVER_MEMORY_DIR`` says otherwise:
#: a tmpfs, one directory per user, made private (:func:`private_root`).
DEFAULT_ROOT = Path(f"/dev/shm/slurm-k8s-recover-{os.getuid()}")  # noqa: S108 (checked)
#: Local copies kept per run and node.
KEEP = 2
#: Share of the wall time the tier may spend on copies (see the module docstring).
BUDGET = 0.05


#: ``--memory-dir`` as the environment gives it.
ENV_MEMORY_DIR = "RECOVER_MEMORY_DIR"


def memory_root(environ: Mapping[str, str]) -> Path:
    """The root of node-local copies a process started with ``environ`` uses by default."""
    return Path(environ.get(ENV_MEMORY_DIR) or DEFAULT_ROOT)


def forget_node(root: Path, node: str) -> None:
    """Remove everything ``node`` keeps under ``root``: what a power cycle does to a tmpfs
    (the local cluster's simulated nodes share one host, so their crash must do it)."""
    if node and "/" not in node and node not in (".", ".."):
        shutil.rmtree(root / node, ignore_errors=True)


def node_name(environ: Mapping[str, str]) -> str:
    """This process's node as Slurm names it (the host name outside Slurm)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def run_key(run_dir: Path) -> str:
    """A short name for ``run_dir`` (its absolute path's digest)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


def local_dir(root: Path, node: str, run_dir: Path, run_id: str) -> Path:
    """Where ``node`` keeps its copies of the run ``run_id`` in ``run_dir``."""
    for what, name in (("node name", node), ("run id", run_id)):
        if not name or "/" in name or name in (".", ".."):
            raise UsageError(f"invalid {what} {name!r} for the memory tier")
    return root / node / run_key(run_dir) / run_id


def private_root(root: Path) -> Path:
    """``root``, created readable by this user only if missing; refused when another user
    owns it (on a shared tmpfs another user could otherwise plant or read copies)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = root.stat().st_uid
    if owner != os.getuid():
        raise UsageError(
            f"{root} belongs to uid {owner}, not to this user ({os.getuid()}); "
            "pass --memory-dir (RECOVER_MEMORY_DIR) a directory of your own"
        )
    return root


RUN_ID_FILE = "run-id"


def run_id(run_dir: Path, *, fresh: bool) -> str:
    """The run's id, kept in ``RUN_DIR/run-id``: a new one when ``fresh`` (a start that
    refuses existing checkpoints) or none is there yet. Process 0 calls this before the
    others read it (:func:`read_run_id`)."""
    path = run_dir / RUN_ID_FILE
    if not fresh:
        try:
            existing = path.read_text().strip()
        except FileNotFoundError:
            existing = ""
        if existing:
            return existing
    new = os.urandom(8).hex()
    tmp = path.with_name(f".{RUN_ID_FILE}.{os.getpid()}")
    tmp.write_text(new + "\n")
    os.replace(tmp, path)
    return new


def read_run_id(run_dir: Path) -> str:
    """The id process 0 wrote (:func:`run_id`)."""
    return (run_dir / RUN_ID_FILE).read_text().strip()


@dataclass
class Saved:
    step: int
    digest: str
    seconds: float


class MemoryTier:
    """Node-local copies of the state, written in the background, at most one at a time."""

    def __init__(
        self,
        directory: Path,
        *,
        every: int,
        run_config: Mapping[str, Any],
        metadata: Mapping[str, Any],
        on_saved: Callable[[Saved], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if every < 1:
            raise UsageError(f"--memory-every must be >= 1 to keep copies (got {every})")
        self.directory = directory
        self.every = every
        self.store = CheckpointStore(directory, retention=RetentionPolicy(keep_last=KEEP))
        self._run_config = dict(run_config)
        self._metadata = dict(metadata)
        self._on_saved = on_saved
        self._on_error = on_error
        self._thread: threading.Thread | None = None
        self._clock = time.monotonic
        self._next_at = 0.0
        self.skipped = 0
        self.failed = 0
        self.copies = 0
        self._remove_other_runs()
        if directory.exists():
            self.store.remove_leftovers()  # a copy cut short by the process's end

    def _remove_other_runs(self) -> None:
        """Copies of earlier runs in a directory of the same name are of no use: free them."""
        parent = self.directory.parent
        try:
            others = [p for p in parent.iterdir() if p.name != self.directory.name]
        except FileNotFoundError:
            return
        for other in others:
            shutil.rmtree(other, ignore_errors=True)

    def discard(self) -> None:
        """Remove this run's copies (it completed: nothing will restore them)."""
        self.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def offer(self, step: int, state: Any) -> bool:
        """Copy ``state`` (at ``step``) when a copy is due and none is being written; whether
        one was started. Never raises for a write that fails: the durable checkpoints are
        the tier below, a failed copy is logged (``on_error``) and the next one tried."""
        if step % self.every:
            return False
        started = self._clock()
        if started < self._next_at or (self._thread is not None and self._thread.is_alive()):
            self.skipped += 1
            return False
        from recovery.checkpoint import tree

        host = tree.to_host(state)
        self._thread = threading.Thread(
            target=self._write, args=(step, host, started), name="memory-tier", daemon=True
        )
        self._thread.start()
        return True

    def _write(self, step: int, host: dict[str, np.ndarray], started: float) -> None:
        try:
            result = self.store.save(
                step,
                host,
                run_config=self._run_config,
                metadata={"data_position": step, **self._metadata},
            )
        except BaseException as e:  # a thread's error would be lost: report it
            self.failed += 1
            if self._on_error is not None:
                self._on_error(e)
            return
        finally:
            spent = self._clock() - started
            self._next_at = started + spent / BUDGET
        self.copies += 1
        if self._on_saved is not None:
            self._on_saved(Saved(step, result.state_digest, result.seconds))

    def wait(self) -> None:
        """Let a copy being written finish."""
        if self._thread is not None:
            self._thread.join()


@dataclass(frozen=True)
class Held:
    """What one process found in its node-local memory."""

    step: int
    digest: str
    arrays: dict[str, np.ndarray] | None
    refused: list[tuple[int, str]]
    """Newer local copies that failed verification: ``(step, reason)``."""


def newest_local(store: CheckpointStore, run_config: Mapping[str, Any], processes: int) -> Held:
    """The newest local copy that verifies (step -1 when none does)."""
    refused: list[tuple[int, str]] = []
    for step in reversed(store.steps()):
        try:
            loaded = store.load(step, run_config=run_config)
        except CheckpointError as e:
            refused.append((step, str(e)))
            continue
        saved_by = int(loaded.manifest.metadata.get("processes", 1))
        if saved_by != processes:
            refused.append((step, f"saved by {saved_by} processes, this run has {processes}"))
            continue
        return Held(step, loaded.state_digest, loaded.arrays, refused)
    return Held(-1, "", None, refused)


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
    run: Run, template: Any, tier: MemoryTier, *, newest_durable: int
) -> FromMemory | str:
    """The state from the newest node-local copy any process holds, sent to every process
    and checked against its digest; or, when none can be used, why (the caller falls back
    to the durable checkpoint). A collective: every process calls it.
    """
    from recovery.checkpoint import tree

    assert run.ranks is not None, "the memory tier restores a job of several processes"
    group = run.ranks.group
    t0 = time.perf_counter()
    try:
        held = newest_local(tier.store, run.config, group.size)
    except OSError as e:  # an unreadable tmpfs is this node's problem, never the job's
        held = Held(-1, "", None, [(-1, f"cannot read {tier.directory}: {e}")])
    for step, reason in held.refused:
        run.log(f"recover: local copy of step {step} is not usable ({reason})")
    node = node_name(os.environ)
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
    items = tree.leaf_paths(template)
    arrays = _broadcast(items, held.arrays if me == holder else None, source=me == holder)
    got = arrays_digest(arrays)
    ok = group.allgather(got == digest, channel="memory")
    if not all(ok):
        bad = [r for r, good in enumerate(ok) if not good]
        return (
            f"the copy of step {best} sent by process {holder} ({holder_node}) did not match "
            f"its digest on process(es) {', '.join(map(str, bad))}"
        )
    state = tree.from_host(template, arrays)
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
