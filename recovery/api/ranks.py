"""``recover train`` as one of several processes: joining, agreeing when to stop, ending.

The generic parts (topology, group, collectives, JAX's runtime) are
:mod:`recovery.multiproc`'s; this module adds what training needs on top:

* the join recorded as a ``joined`` event, and a lost peer as a ``peer-lost`` event followed
  at once by exit :data:`EXIT_PEER_LOST` (76); by the failing peer's own status when it
  failed on purpose (an error: every process then ends alike); by the run's own status once
  it is complete, so a peer dying after the end never turns a success into a failure;
* :class:`StopVote`: every process stops after the same step when any of them got
  SIGTERM/SIGUSR1 (a signal reaches processes at different steps);
* :func:`finish`: JAX's runtime and the group closed together, never mistaken for a death.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from recovery.errors import PeerLostError, RecoverError
from recovery.events import EventLog
from recovery.multiproc import (
    EXIT_PEER_LOST,
    Gathering,
    Group,
    PeerLost,
    Topology,
    exit_on_loss,
    join,
    join_jax,
    leave_jax,
)

#: ``RECOVER_PEER_WATCH=0`` leaves a lost peer unnoticed, so the other processes block in
#: their collective as a job without this watch would (for measuring the alternative only).
ENV_WATCH = "RECOVER_PEER_WATCH"

#: Where a process writes its one-line messages (stderr in ``recover train``).
Log = Callable[[str], None]


@dataclass
class Ranks:
    """This process's place in a multi-process run, and what a loss ends it with."""

    group: Group
    exit_code: int = EXIT_PEER_LOST
    """The status a lost peer ends this process with now (the run's own once complete)."""
    step: int | None = None
    """The step the loop is at, for the ``peer-lost`` event."""

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def size(self) -> int:
        return self.group.size


def start(
    topology: Topology, events: EventLog, log: Log, *, environ: dict[str, str] | None = None
) -> Ranks:
    """Join the group and JAX's runtime; record ``joined``. Call before JAX is used.

    Raises:
        GroupError, PeerLostError: the join failed (see :func:`recovery.multiproc.join`).
    """
    env = os.environ if environ is None else environ
    t0 = time.perf_counter()
    holder: list[Ranks] = []

    def code() -> int:
        return holder[0].exit_code if holder else EXIT_PEER_LOST

    def record(lost: PeerLost) -> None:
        status = code()
        if status == EXIT_PEER_LOST and lost.status is not None:
            status = lost.status
        events.emit(
            "peer-lost",
            step=holder[0].step if holder else None,
            lost_rank=lost.rank,
            reason=lost.reason,
            heard_unix=round(lost.at, 6),
            exit_code=status,
        )

    try:
        group = join(
            topology,
            on_lost=exit_on_loss(record, code=code),
            react=env.get(ENV_WATCH, "1") != "0",
        )
    except PeerLostError as e:  # lost during the join: recorded as any other loss
        record(PeerLost(e.rank, e.reason, time.time(), None))
        raise
    ranks = Ranks(group)
    holder.append(ranks)
    address = join_jax(group)
    join_s = time.perf_counter() - t0
    events.emit(
        "joined",
        step=None,
        join_s=round(join_s, 6),
        rendezvous=f"{topology.rendezvous[0]}:{topology.rendezvous[1]}"
        if topology.rendezvous
        else None,
        jax_coordinator=address,
        session=group.session,
    )
    log(f"recover: process {group.rank} of {group.size} joined in {join_s:.2f}s")
    return ranks


class StopVote:
    """Whether to stop before the next step: any process's SIGTERM/SIGUSR1, agreed by all;
    and whether to keep a memory copy (:mod:`recovery.api.memory`) after it: process 0's
    call, so that every process copies after the same step (each waits for the others in
    the next collective: copies at different steps would cost each process all of them).

    Each call sends this process's signal (or 0) and copy wish, and reads the votes sent one
    call earlier, so the round trip overlaps a training step instead of adding to it, and
    every process acts on the same votes: all stop after the same step, one step after the
    first signal.
    """

    def __init__(self, ranks: Ranks) -> None:
        self._group = ranks.group
        self._previous: Gathering | None = None

    def __call__(self, signal_seen: int | None, copy: bool = False) -> tuple[int | None, bool]:
        """The signal to stop for (the lowest rank's) or None to go on, and process 0's copy
        wish of the previous call.

        Raises:
            PeerLostError: a process was lost (normally the watch has ended this one first).
        """
        current = self._group.start_allgather([signal_seen or 0, bool(copy)], channel="loop")
        previous, self._previous = self._previous, current
        if previous is None:
            return None, False
        votes = previous.result()
        return next((int(v[0]) for v in votes if v[0]), None), bool(votes[0][1])


def finish(ranks: Ranks, exit_code: int, log: Log) -> None:
    """End together after a complete or preempted run whose status is ``exit_code``: from
    now on a lost peer ends this process with that status; JAX's runtime, then the group,
    are closed (both wait for every process)."""
    ranks.exit_code = exit_code
    leave_jax()
    try:
        ranks.group.leave()
    except PeerLostError as e:  # our part is done and durable; the others' is theirs
        log(f"recover: {e} while leaving; this process's run is complete")


#: Seconds an error that may come from a lost peer waits for the watch to confirm it.
LOSS_GRACE_S = 5.0


@contextmanager
def failing_together(ranks: Ranks | None) -> Iterator[None]:
    """Tell the other processes when this one fails, so they stop instead of waiting.

    An error that a lost peer may have caused (a collective of the runtime failing because
    its peer's connection reset: gloo notices a dead peer too) first waits up to
    :data:`LOSS_GRACE_S` for the group's news of a loss: if it comes, the watch ends this
    process (status 76, ``peer-lost`` event), as for any loss, and the error is not this
    process's to report.
    """
    try:
        yield
    except BaseException as e:
        if ranks is None:
            raise
        maybe_a_loss = isinstance(e, PeerLostError) or not isinstance(e, RecoverError)
        if maybe_a_loss and ranks.group.wait_lost(LOSS_GRACE_S) is not None:
            time.sleep(LOSS_GRACE_S)  # the watch is ending this process meanwhile
            raise
        status = e.exit_code if isinstance(e, RecoverError) else 1
        ranks.group.abort(f"{type(e).__name__}: {e}", status)
        raise


def exit_now(error: BaseException) -> None:
    """End a process of a multi-process run after ``error`` without Python's exit hooks:
    JAX's would wait (up to minutes) for the other processes to shut down with it."""
    status = error.exit_code if isinstance(error, RecoverError) else 1
    if isinstance(error, RecoverError):
        print(f"recover: error: {error}", file=sys.stderr)
    else:
        import traceback

        traceback.print_exception(error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
