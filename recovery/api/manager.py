"""The checkpoint manager of the library API: verified checkpoints of any training state.

A facade over :class:`recovery.checkpoint.CheckpointStore` (the on-disk format and the
durability protocol of ``docs/checkpoint-format.md``, unchanged) and its background saver,
with pytrees in and out (:mod:`recovery.api.pytree`) and the ``checkpoint``, ``restored`` and
``fallback`` events the run report reads (:mod:`recovery.events`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from recovery.api import pytree
from recovery.checkpoint import (
    AsyncCheckpointer,
    CheckpointStore,
    Loaded,
    RetentionPolicy,
    RunLock,
    SaveResult,
    StepStatus,
    commit,
)
from recovery.checkpoint import format as fmt
from recovery.errors import BackgroundSaveError, NoCheckpointError, UsageError
from recovery.events import EventLog

if TYPE_CHECKING:
    from recovery.api.processes import Processes

T = TypeVar("T")


@dataclass(frozen=True)
class Skipped:
    """A newer checkpoint that failed verification on the way to the one restored."""

    step: int
    reason: str
    """Why it failed, e.g. ``leaf params/w digest mismatch``."""
    moved_to: str | None
    """Where it was set aside (a ``.damaged-`` name in the checkpoint directory); None for a
    read-only manager, which leaves it in place."""


@dataclass(frozen=True)
class Restored(Generic[T]):
    """A state read back from a checkpoint that passed every check: what
    :meth:`CheckpointManager.restore` returns (and :meth:`~CheckpointManager.restore_or_none`,
    and :meth:`~CheckpointManager.restore_arrays` with a flat dict as ``state``)."""

    step: int
    state: T
    """Shaped like the template; for :meth:`CheckpointManager.restore_arrays`, the flat
    ``leaf path -> numpy array`` dict."""
    metadata: dict[str, Any]
    """What was passed as ``metadata`` to :meth:`CheckpointManager.save`."""
    state_digest: str
    """Digest of the whole saved state; equal digests mean bit-identical states."""
    skipped: tuple[Skipped, ...]
    """Newer checkpoints that failed verification, newest first."""
    seconds: float
    """Wall seconds spent reading, verifying and placing the state."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint, as its manifest describes it."""

    step: int
    created_unix: float
    """When the save finished, Unix seconds."""
    metadata: dict[str, Any]
    run_config: dict[str, Any]
    state_digest: str
    total_bytes: int
    leaves: int

    @classmethod
    def of(cls, manifest: fmt.Manifest) -> CheckpointInfo:
        return cls(
            step=manifest.step,
            created_unix=manifest.created_unix,
            metadata=dict(manifest.metadata),
            run_config=dict(manifest.run_config),
            state_digest=fmt.state_digest(manifest.leaves),
            total_bytes=manifest.total_bytes,
            leaves=len(manifest.leaves),
        )


class CheckpointManager:
    """Saves and restores a training state under ``directory``, one ``step_N`` per save.

    The first :meth:`save` or :meth:`restore` takes the directory's run lock (one writer per
    run; a second one gets :class:`RunLockedError`) and removes what interrupted saves left;
    :meth:`close` (or leaving the ``with`` block) finishes the save in flight and releases it.

    Args:
        directory: the checkpoint root (created on the first save).
        run_config: what makes two runs the same run (model, seed, ...): stored in every
            checkpoint, and a restore refuses a checkpoint saved with another one
            (:class:`ConfigMismatchError`, listing the differences). Plain JSON.
        keep_last: keep this many newest checkpoints (None: keep every one).
        keep_every: also keep each step divisible by this (milestones); None: none.
        async_save: write in the background; :meth:`save` then returns once the state is
            copied to host memory. A failed background save is raised by the next call.
        events: where ``checkpoint``, ``restored`` and ``fallback`` events go (see
            :func:`recovery.api.open_event_log`); None: nowhere.
        read_only: never lock, write, or set anything aside (for an evaluation job reading
            a run that is still training).
        clock: wall clock in seconds (manifest timestamps and ages).
        workers: threads that write or read data files in parallel.
        processes: for a job of several processes (:func:`recovery.api.join`): every
            process makes the same calls in the same order; each writes its share of every
            save and process 0 commits it (one checkpoint, whatever the count, which its
            metadata records as ``processes``), a restore takes the newest step that
            verifies for all of them, and process 0 alone holds the run lock, sets damaged
            steps aside and applies retention. Arrays sharded over several processes'
            devices are gathered for the save and placed back with the template's sharding
            on restore.
        log: where one-line messages go (a checkpoint that failed verification, an old one
            that could not be deleted, a hand-over that blocked the loop for over a second);
            None: nowhere. ``recover train`` passes its standard error.
        lock_wait: seconds to wait for the run lock while another process holds it (the
            training process of an earlier run on a node that hung may hold it until the
            node is power-cycled); 0: fail at once with :class:`RunLockedError`.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        run_config: Mapping[str, Any] | None = None,
        keep_last: int | None = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        events: EventLog | None = None,
        read_only: bool = False,
        clock: Callable[[], float] = time.time,
        workers: int = 16,
        processes: Processes | None = None,
        log: Callable[[str], None] | None = None,
        lock_wait: float = 0.0,
    ) -> None:
        if keep_last is None and keep_every is not None:
            raise UsageError("keep_every needs keep_last (keep_last=None keeps everything)")
        if lock_wait < 0:
            raise UsageError(f"lock_wait must be >= 0 seconds (got {lock_wait})")
        retention = None
        if keep_last is not None:
            retention = RetentionPolicy(keep_last=keep_last, keep_every=keep_every)
        self.directory = Path(directory)
        self.run_config: dict[str, Any] = dict(run_config or {})
        self.events = events
        self.read_only = read_only
        self._async = async_save
        self._store = CheckpointStore(
            self.directory, clock=clock, workers=workers, retention=retention
        )
        self.processes = processes
        peers = None if processes is None else processes.group.channel("save")
        self._saver = AsyncCheckpointer(self._store, on_saved=self._saved, peers=peers)
        self._lock = RunLock(self.directory)
        self._lock_wait = lock_wait
        self._locked = False
        self._writing = False
        # step -> seconds the caller was blocked handing that save over; popped once durable
        self._blocked: dict[int, float] = {}
        self._log: Callable[[str], None] = log if log is not None else _quiet
        # (step, state digest) of the checkpoint this manager restored, for finalize()
        self._restored_from: tuple[int, str] | None = None

    # --- writing -----------------------------------------------------------------------------

    def save(
        self, step: int, state: Any, *, metadata: Mapping[str, Any] | None = None
    ) -> SaveResult | None:
        """Save ``state`` (any pytree of arrays, numbers and typed PRNG keys; ``None`` is an
        empty subtree) as checkpoint ``step``.

        Waits for the previous background save first (at most one in flight). An existing
        ``step_N`` is replaced only once the new one is durable; then retention deletes what
        it no longer keeps.

        With several processes the metadata records their count as ``processes`` (unless
        ``metadata`` names it): a restore by another count can tell.

        Returns:
            The durable save's result when saving synchronously; None when the save runs in
            the background (:meth:`wait` returns it).
        Raises:
            UsageError: read-only manager, negative step, a leaf that is not an array, a
                number or PRNG keys (the message names it), or ``metadata`` that is not plain
                JSON.
            BackgroundSaveError: the previous background save failed (or this one, when
                synchronous); the cause is chained.
            RunLockedError: another process writes to this directory.
        """
        self._writer()
        t = time.perf_counter()
        self._saver.wait()
        host, keys = pytree.flatten(state, private=self._async)
        meta = dict(metadata or {})
        if self.processes is not None:
            meta.setdefault("processes", self.processes.size)
        # Checked here, not only on the saving thread: bad input is the caller's error now,
        # not a BackgroundSaveError at the next call.
        commit.checked_input(step, host, self.run_config, meta, keys)
        blocked = self._blocked[step] = time.perf_counter() - t
        self._saver.save(step, host, run_config=self.run_config, metadata=meta, key_impls=keys)
        if not self._async:
            return self._saver.wait()
        if blocked > 1.0:
            self._log(f"recover: training blocked {blocked:.2f}s handing step {step} to the saver")
        return None

    def finalize(
        self, step: int, state: Any, *, metadata: Mapping[str, Any] | None = None
    ) -> str:
        """Make ``state`` durable as checkpoint ``step`` and return its state digest: what a
        loop does at its last step or before it exits for a preemption.

        Waits for the save in flight; saves ``step`` (and waits for it) unless that save, or
        the checkpoint this manager restored, is ``step`` already. With several processes
        every process calls it at the same step.

        Raises:
            BackgroundSaveError: this save or the one before it failed.
            UsageError: as :meth:`save`.
        """
        last = self._saver.wait()
        if last is not None and last.step == step:
            return last.state_digest
        if self._restored_from is not None and self._restored_from[0] == step:
            return self._restored_from[1]
        self.save(step, state, metadata=metadata)
        done = self._saver.wait()
        assert done is not None, "a save that raised nothing has a result"
        return done.state_digest

    def wait(self) -> SaveResult | None:
        """Block until no save is in flight; the newest save's result (None before any).

        Raises:
            BackgroundSaveError: the background save failed; the cause is chained.
        """
        return self._saver.wait()

    def _saved(self, result: SaveResult) -> None:
        """On the saving thread, once ``result`` is durable."""
        self._retention_errors(result.retention_errors)
        if self.events is not None:
            self.events.emit(
                "checkpoint",
                step=result.step,
                checkpoint_step=result.step,
                state_digest=result.state_digest,
                bytes=result.total_bytes,
                save_s=round(result.seconds, 6),
                blocked_s=round(self._blocked.pop(result.step, 0.0), 6),
                deleted_steps=list(result.deleted_steps),
                retention_errors=list(result.retention_errors),
            )

    # --- restoring ---------------------------------------------------------------------------

    def restore(self, template: T, *, step: int | None = None) -> Restored[T]:
        """The newest checkpoint that verifies (or exactly ``step``), shaped like ``template``.

        ``template`` is a state of the same structure: a freshly initialised one, or
        ``jax.eval_shape`` of the initialiser (nothing allocated); each leaf with a sharding
        gets its array placed that way, and a leaf of typed PRNG keys gets the saved keys
        back. Newer checkpoints that fail verification are skipped and reported in
        :attr:`Restored.skipped` (and set aside unless read-only).

        Raises:
            NoCheckpointError: there is no checkpoint at all (see :meth:`restore_or_none`).
            AllCheckpointsDamagedError: every checkpoint failed; each reason is listed.
            CheckpointDamaged: ``step`` was given and that checkpoint fails verification.
            ConfigMismatchError: the checkpoint was saved with another ``run_config``.
            CheckpointError: the saved leaves do not match ``template`` (names, dtypes,
                shapes, PRNG keys of another implementation), naming each difference.
        """
        t = time.perf_counter()
        loaded, skipped = self._load(step)
        state = pytree.unflatten(template, loaded.arrays, loaded.key_impls)
        return self._restored(loaded, state, skipped, t)

    def restore_or_none(self, template: T) -> Restored[T] | None:
        """:meth:`restore`'s :class:`Restored`, or None where the directory holds no
        checkpoint (a fresh run)."""
        self._saver.wait()  # a save of this manager's still in flight counts
        steps = self._store.steps()
        if self.processes is not None:  # process 0's listing decides, for all alike
            steps = self.processes.allgather(steps)[0]
        if not steps:
            if not self.read_only:
                self._writer()
            return None
        return self.restore(template)

    def restore_arrays(self, *, step: int | None = None) -> Restored[dict[str, np.ndarray]]:
        """:meth:`restore` without a template: a :class:`Restored` whose ``state`` is the flat
        ``leaf path -> numpy array`` dict, paths as saved (``opt_state/0/mu/w``); a leaf saved
        from PRNG keys is their key data (``uint32``). Same errors, less the template's."""
        t = time.perf_counter()
        loaded, skipped = self._load(step)
        return self._restored(loaded, dict(loaded.arrays), skipped, t)

    def _load(self, step: int | None) -> tuple[Loaded, tuple[Skipped, ...]]:
        if not self.read_only:
            self._writer()
        # A save this manager started in the background is read back once it is durable,
        # never skipped as "no checkpoint" because it was still being written.
        self._saver.wait()
        if step is not None:
            if step not in self._store.steps():
                raise self._unknown_step(step)
            return self._store.load(step, run_config=self.run_config), ()
        if self.processes is None:
            result = self._store.restore_latest(run_config=self.run_config)
        else:
            result = self._store.restore_agreed(
                peers=self.processes.group.channel("main"), run_config=self.run_config
            )
        lead = not self.read_only and self._lead
        skipped = []
        for bad, reason in result.fallbacks:
            self._log(
                f"recover: checkpoint step {bad} failed verification ({reason}); falling back"
            )
            moved = self._store.set_aside(bad).name if lead else None
            skipped.append(Skipped(bad, reason, moved))
            if self.events is not None:
                self.events.emit("fallback", step=bad, reason=reason, moved_to=moved)
        if lead:
            # A run killed between a save and its retention left extra steps; trim them now
            # that the restored step is known to be intact.
            _, errors = self._store.apply_retention(newest_durable=result.loaded.step)
            self._retention_errors(errors)
        return result.loaded, tuple(skipped)

    def _retention_errors(self, errors: Sequence[str]) -> None:
        """One line per old checkpoint that could not be deleted (the next save retries)."""
        for error in errors:
            self._log(f"recover: could not delete an old checkpoint ({error}); will retry later")

    def _restored(
        self, loaded: Loaded, state: T, skipped: tuple[Skipped, ...], t0: float
    ) -> Restored[T]:
        seconds = time.perf_counter() - t0
        self._restored_from = (loaded.step, loaded.state_digest)
        if self.events is not None:
            self.events.emit(
                "restored",
                step=loaded.step,
                checkpoint_step=loaded.step,
                data_position=loaded.manifest.metadata.get("data_position", loaded.step),
                state_digest=loaded.state_digest,
                bytes=loaded.manifest.total_bytes,
                restore_s=round(seconds, 6),
                fallbacks=len(skipped),
                saved_processes=int(loaded.manifest.metadata.get("processes", 1)),
                source="checkpoint",
            )
        return Restored(
            step=loaded.step,
            state=state,
            metadata=dict(loaded.manifest.metadata),
            state_digest=loaded.state_digest,
            skipped=skipped,
            seconds=seconds,
        )

    # --- listing and checking ----------------------------------------------------------------

    def steps(self) -> list[int]:
        """Step numbers of the committed checkpoints, ascending (not verified)."""
        return self._store.steps()

    def latest_step(self) -> int | None:
        """The newest committed step (not verified), or None."""
        steps = self._store.steps()
        return steps[-1] if steps else None

    def status(self, *, deep: bool = True) -> list[StepStatus]:
        """What ``recover checkpoint ls`` shows, one :class:`StepStatus` per entry: every
        checkpoint (newest first) and every leftover, ``intact``/``incomplete``/``corrupt``
        with the reason. ``deep`` re-reads and hashes every byte; without it only manifests
        and sizes are checked."""
        return self._store.scan(deep=deep)

    def info(self, step: int) -> CheckpointInfo:
        """Checkpoint ``step`` as its manifest describes it; reads no data (fast, and a
        flipped data byte goes unnoticed: :meth:`verify` reads everything).

        Raises:
            UsageError: there is no such step (the message lists the steps there are).
            CheckpointDamaged: its manifest is missing or invalid.
        """
        from recovery.checkpoint import verify

        if step not in self._store.steps():
            raise self._unknown_step(step)
        return CheckpointInfo.of(verify.read_manifest(self.directory, step))

    def verify(self, step: int) -> CheckpointInfo:
        """Re-read and hash every byte of checkpoint ``step`` (what ``recover checkpoint
        verify`` does); its :class:`CheckpointInfo` once every check passed.

        Raises:
            UsageError: there is no such step.
            CheckpointDamaged: the step fails a check; ``reason`` says which.
        """
        if step not in self._store.steps():
            raise self._unknown_step(step)
        return CheckpointInfo.of(self._store.verify(step))

    def _unknown_step(self, step: int) -> UsageError | NoCheckpointError:
        steps = self._store.steps()
        if not steps:
            return NoCheckpointError(f"{self.directory} holds no checkpoint")
        known = ", ".join(str(s) for s in steps)
        return UsageError(f"Unknown step {step} in {self.directory}. Known: {known}")

    # --- lifetime ----------------------------------------------------------------------------

    def open(self) -> list[str]:
        """Become the run's one writer now: take the run lock (waiting up to ``lock_wait``
        seconds), remove what interrupted saves left, and with several processes wait until
        process 0 has done so (a collective). The first save or restore does this by itself;
        call it first to hold the lock before the run announces itself (the ``started``
        event) and to know what was removed.

        Returns:
            The names of the leftovers removed (process 0's; [] on the others, and on any
            call after the first).
        Raises:
            UsageError: a read-only manager.
            RunLockedError: another process still holds the lock after ``lock_wait``.
        """
        if self.read_only:
            raise UsageError(f"this CheckpointManager of {self.directory} is read-only")
        if self._writing:
            return []
        removed: list[str] = []
        if self._lead:
            self._lock.acquire(self._lock_wait, on_wait=self._waiting)
            self._locked = True
            removed = self._store.remove_leftovers()
        self._writing = True
        if self.processes is not None:
            self.processes.barrier()  # nobody writes before the leftovers are gone
        return removed

    def _waiting(self, holder: str) -> None:
        self._log(
            f"the run lock is held by pid {holder} (a process of an earlier run, on a node "
            f"that hung?); waiting up to {self._lock_wait:g} s for it"
        )

    def _writer(self) -> None:
        """Become the run's one writer (once): :meth:`open`."""
        self.open()

    @property
    def _lead(self) -> bool:
        """Whether this process holds the lock and tidies (process 0, or the only one)."""
        return self.processes is None or self.processes.rank == 0

    def close(self) -> None:
        """Finish the save in flight, then release the run lock.

        Raises:
            BackgroundSaveError: that save failed (the lock is released all the same).
        """
        try:
            self._saver.close()
        finally:
            if self._locked:
                self._lock.release()
                self._locked = False
            self._writing = False

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except BackgroundSaveError as save_error:
            # Already failing: keep the first error, with the save's failure attached.
            exc.add_note(f"also: {save_error}")


def _quiet(message: str) -> None:
    """The default ``log``: messages go nowhere."""
