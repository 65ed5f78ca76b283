"""Multi-process jobs, independent of what the processes compute: where a process sits
(:func:`topology_from_env`), forming the group (:func:`join`), small collectives
(:meth:`Group.allgather`, :meth:`Group.barrier`, :meth:`Group.any`), prompt news of a dead
peer (``on_lost``, :func:`exit_on_loss`), and JAX's distributed runtime joined with explicit
arguments (:func:`join_jax`).

A typical process::

    topo = topology_from_env(os.environ)
    if topo.multi:
        group = join(topo, on_lost=exit_on_loss(record=lambda lost: log(lost)))
        join_jax(group)
    ...                     # train; group.any(signal_seen) agrees on when to stop
    leave_jax(); group.leave()

``docs/multiprocess.md`` describes the protocol, the environment and the exit codes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from recovery.contract.exits import EXIT_PEER_LOST
from recovery.multiproc.group import Channel, Gathering, Group, OnLost, PeerLost
from recovery.multiproc.jaxjoin import free_port, join_jax, leave_jax
from recovery.multiproc.rendezvous import HEARTBEAT_S, JOIN_TIMEOUT_S, SILENCE_S, join
from recovery.multiproc.topology import (
    ENV_GROUP,
    ENV_PROCESS_ID,
    ENV_PROCESSES,
    ENV_RENDEZVOUS,
    Topology,
    parse_address,
    topology_from_env,
)

__all__ = [
    "ENV_GROUP",
    "ENV_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_RENDEZVOUS",
    "EXIT_PEER_LOST",
    "HEARTBEAT_S",
    "JOIN_TIMEOUT_S",
    "SILENCE_S",
    "Channel",
    "Gathering",
    "Group",
    "OnLost",
    "PeerLost",
    "Topology",
    "exit_on_loss",
    "free_port",
    "join",
    "join_jax",
    "leave_jax",
    "parse_address",
    "topology_from_env",
]


def exit_on_loss(
    record: Callable[[PeerLost], None] | None = None,
    *,
    code: Callable[[], int] | int = EXIT_PEER_LOST,
) -> OnLost:
    """An ``on_lost`` that records the loss, then ends this process at once with ``code``
    (an int, or a function giving it at that moment: e.g. 0 once the work is complete) - or,
    while ``code`` is :data:`EXIT_PEER_LOST`, with the status a peer that failed on purpose
    reported (:meth:`Group.abort`), so that every process of the job ends alike.

    The end is ``os._exit``: the main thread may be blocked in a collective that will never
    finish, and no clean-up may wait on the dead peer. ``record`` should be quick (append an
    event); an error in it is printed, never allowed to stop the exit.
    """

    def on_lost(lost: PeerLost) -> None:
        try:
            if record is not None:
                record(lost)
        except BaseException as e:  # the exit must happen whatever the record did
            print(f"recover: could not record the lost peer: {e}", file=sys.stderr)
        status = code() if callable(code) else code
        if status == EXIT_PEER_LOST and lost.status is not None:
            status = lost.status
        print(
            f"recover: stopping (exit {status}): "
            f"{'process ' + str(lost.rank) if lost.rank is not None else 'a peer'} "
            f"was lost: {lost.reason}",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(status)

    return on_lost
