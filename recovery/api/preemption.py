"""Preemption for user training loops: a signal asks for a save, then exit status 75.

The contract ``recover sbatch`` relies on (``docs/slurm.md``): Slurm sends SIGUSR1 ahead of a
time limit (``--signal``) and SIGTERM on cancel, preemption or node loss; the process finishes
its step, saves, and exits with :data:`EXIT_PREEMPTED` (75, EX_TEMPFAIL), which the job
script answers by requeueing the job. Built on :mod:`recovery.contract.exits`, which
``recover train`` uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from signal import SIGTERM, Signals
from signal import signal as _install
from types import FrameType
from typing import Any, NoReturn

from recovery.api.manager import CheckpointManager
from recovery.api.processes import Processes, leave
from recovery.contract import exits

#: Exit status after a preemption signal that was handled by saving: "try again".
EXIT_PREEMPTED = exits.EXIT_PREEMPTED
#: Exit status that asks never to be restarted (another run would fail the same way): the
#: coordinator does not requeue a job that exits with it, even on a node taken out for a fault.
EXIT_DO_NOT_RESTART = exits.EXIT_DO_NOT_RESTART
#: The signals that ask for a save and a stop: SIGTERM and SIGUSR1.
PREEMPT_SIGNALS = exits.PREEMPT_SIGNALS


class Preemption:
    """Remembers the first SIGTERM/SIGUSR1; the loop checks :attr:`requested` between steps.

    Typical use::

        with manager, Preemption().installed() as preemption:
            for step in range(start, steps):
                state = train_step(state, batch(step))
                if preemption.requested:
                    preemption.save_and_exit(manager, step + 1, state)
    """

    def __init__(self) -> None:
        self._signal: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is None:
            self._signal = signum

    @contextmanager
    def installed(self) -> Iterator[Preemption]:
        """Handle :data:`PREEMPT_SIGNALS` inside the block (``as`` gives this Preemption);
        the previous handlers come back afterwards. Only the main thread may install signal
        handlers (``ValueError``)."""
        previous = {s: _install(s, self._handle) for s in PREEMPT_SIGNALS}
        try:
            yield self
        finally:
            for s, h in previous.items():
                _install(s, h)

    @property
    def requested(self) -> bool:
        """Whether a preemption signal arrived."""
        return self._signal is not None

    @property
    def signal(self) -> int | None:
        """The first preemption signal received, or None."""
        return self._signal

    def requested_by_any(self, processes: Processes | None) -> bool:
        """Whether any process of the job got a preemption signal (a collective: call it on
        every process at the same step, so that all stop after that step - a signal reaches
        processes at different moments). :attr:`requested` for a single process (None)."""
        if processes is None:
            return self.requested
        return processes.any(self.requested)

    def request(self, signum: int = SIGTERM) -> None:
        """Act as if ``signum`` had arrived (a scheduler hook, a test, a health check)."""
        self._handle(signum, None)

    def save_and_exit(
        self,
        manager: CheckpointManager,
        step: int,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> NoReturn:
        """Make ``state`` durable as ``step``, record ``preempted``, exit with status 75.

        Waits for the save in flight; saves ``step`` unless that save, or the checkpoint the
        manager restored, was ``step`` already, and waits for it
        (:meth:`CheckpointManager.finalize`). The ``preempted`` event goes to the manager's
        event log. With several processes (the manager's ``processes``) every process must
        call it at the same step (see :meth:`requested_by_any`); they then leave together
        (:func:`leave` with 75) before exiting.

        Raises:
            SystemExit: with :data:`EXIT_PREEMPTED`, once the checkpoint is durable.
            BackgroundSaveError: the save failed; the process must not report a clean
                preemption then (the scheduler's requeue would resume an older step).
        """
        manager.finalize(step, state, metadata=metadata)
        name = Signals(self._signal or SIGTERM).name
        if manager.events is not None:
            manager.events.emit("preempted", step=step, checkpoint_step=step, signal=name)
        leave(manager.processes, EXIT_PREEMPTED)
        raise SystemExit(EXIT_PREEMPTED)
