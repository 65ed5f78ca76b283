"""Several processes for user training loops: where this process sits, joining the others
and JAX's distributed runtime, agreeing, failing and ending together.

The same machinery as multi-process ``recover train`` (:mod:`recovery.multiproc` for the
group, :mod:`recovery.api.ranks` for the events and exit statuses), behind a few names.
``docs/multiprocess.md`` describes the launch (``recover sbatch -N K``, or the three
``RECOVER_*`` variables for another launcher) and what happens when a process dies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from recovery.api import ranks as _ranks
from recovery.contract.exits import EXIT_PREEMPTED, PREEMPT_SIGNALS
from recovery.events import EventLog
from recovery.multiproc import EXIT_PEER_LOST, Group, Topology
from recovery.multiproc import topology_from_env as _topology_from_env

__all__ = [
    "EXIT_PEER_LOST",
    "Processes",
    "Topology",
    "failing_together",
    "join",
    "leave",
    "topology_from_env",
]


class Processes:
    """This process's part in a joined job of several processes (made by :func:`join`).

    Collectives (:meth:`allgather`, :meth:`any`, :meth:`barrier`) must be called by every
    process in the same order. A peer that dies ends this process at once with
    :data:`EXIT_PEER_LOST` (76) after a ``peer-lost`` event, even while it waits in a JAX
    collective; after :func:`leave` with a status, a late loss ends it with that status.
    """

    def __init__(self, ranks: _ranks.Ranks, topology: Topology) -> None:
        self._ranks = ranks
        self.topology = topology

    @property
    def rank(self) -> int:
        """0-based; process 0 commits checkpoints and holds the run lock."""
        return self._ranks.rank

    @property
    def size(self) -> int:
        return self._ranks.size

    @property
    def group(self) -> Group:
        """The underlying group (channels for collectives from other threads)."""
        return self._ranks.group

    @property
    def step(self) -> int | None:
        """The step the loop is at, recorded in a ``peer-lost`` event; set it as you go."""
        return self._ranks.step

    @step.setter
    def step(self, value: int | None) -> None:
        self._ranks.step = value

    def allgather(self, value: Any) -> list[Any]:
        """Every process's ``value`` (plain JSON), in rank order.

        Raises:
            PeerLostError: a process was lost (normally the watch has ended this one first).
        """
        return self.group.allgather(value)

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any: e.g. whether any of them got
        a preemption signal, so that all stop after the same step."""
        return self.group.any(flag)

    def barrier(self) -> None:
        """Return once every process got here."""
        self.group.barrier()


def topology_from_env(environ: Mapping[str, str] | None = None) -> Topology:
    """This process's rank, the process count and process 0's rendezvous address, from the
    launcher's environment (default: this process's): ``RECOVER_NUM_PROCESSES``,
    ``RECOVER_PROCESS_ID`` and ``RECOVER_RENDEZVOUS``, or srun's ``SLURM_STEP_NUM_TASKS`` and
    ``SLURM_PROCID`` with ``RECOVER_RENDEZVOUS`` (``recover sbatch`` sets it).

    Raises:
        UsageError: a count or rank that is not a number or out of range, half of the
            ``RECOVER_*`` pair, or several processes without ``RECOVER_RENDEZVOUS``.
    """
    return _topology_from_env(os.environ if environ is None else environ)


def join(
    events: EventLog,
    *,
    topology: Topology | None = None,
    environ: Mapping[str, str] | None = None,
) -> Processes | None:
    """Join the job's other processes, then JAX's distributed runtime (gloo collectives on
    CPU); record ``joined`` in ``events``. Call it before anything uses JAX, on every process.

    Returns None for a single process (nothing to join): code written for K processes then
    runs unchanged as one. With several, SIGTERM and SIGUSR1 are ignored from then on except
    inside :meth:`Preemption.installed` (srun TERMs the others once one exits 75 at the
    end; each must keep its own status).

    Raises:
        UsageError: a bad launcher environment (see :func:`topology_from_env`).
        GroupError: process 0 cannot be reached within 180 s, or refused this process.
        PeerLostError: a process was lost during the join.
    """
    env = dict(os.environ if environ is None else environ)
    topo = _topology_from_env(env) if topology is None else topology
    if not topo.multi:
        return None
    # Once the run is over, the first process to exit 75 makes srun (--kill-on-bad-exit)
    # TERM the others while they exit too: ignored outside Preemption.installed(), so each
    # keeps its own status and the job requeues (as multi-process `recover train` does).
    if threading.current_thread() is threading.main_thread():
        for sig in PREEMPT_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    return Processes(_ranks.start(topo, events, _log, environ=env), topo)


def leave(processes: Processes | None, exit_code: int = 0) -> None:
    """End together after a run that ends with ``exit_code`` (0: complete; 75: preempted):
    from now on a lost peer ends this process with that status; JAX's runtime, then the
    group, are closed (both wait for every process). Nothing for None (a single process)."""
    if processes is not None:
        _ranks.finish(processes._ranks, exit_code, _log)


@contextmanager
def failing_together(processes: Processes | None) -> Iterator[None]:
    """Around the training loop: an error in this process is told to the others (they stop
    with its status instead of waiting in a collective), and an error caused by a lost peer
    ends this process as a loss (76). Nothing extra for None."""
    if processes is None:
        yield
        return
    ending: SystemExit | None = None
    with _ranks.failing_together(processes._ranks):
        try:
            yield
        except SystemExit as e:
            # A clean end (complete, or preempted once the checkpoint is durable) is no
            # failure to tell the others about.
            if e.code not in (None, 0, EXIT_PREEMPTED):
                raise
            ending = e
    if ending is not None:
        raise ending


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
