"""Joining JAX's distributed runtime with explicit arguments, never its auto-detection.

JAX's Slurm auto-detection takes process 0's host from the first node *name*, which need not
resolve (it does not on the local cluster, nor on many real ones); every process then waits
out the initialisation timeout. Here the address is the rendezvous host (process 0's node
address) and a port process 0 picks free and shares through the group.
"""

from __future__ import annotations

import socket

from recovery.multiproc.group import Group


def free_port() -> int:
    """A TCP port free on this host right now (on every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def join_jax(group: Group, *, timeout_s: int = 300) -> str:
    """``jax.distributed.initialize`` for ``group``'s processes; returns the coordinator
    address used. CPU collectives go through gloo (a no-op on GPU and TPU backends). Call it
    before anything initialises a JAX backend, on every process (a collective).

    Raises:
        PeerLostError: a process was lost while the port was shared.
        RuntimeError: JAX's own initialisation failed (as JAX raises it).
    """
    import jax

    assert group.topology.rendezvous is not None
    port = group.allgather(free_port() if group.rank == 0 else None)[0]
    address = f"{group.topology.rendezvous[0]}:{port}"
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's own preemption service takes SIGTERM for itself (a C++ handler), so the
    # process's own handler would never see it; agreeing when to stop is the caller's job.
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=group.size,
        process_id=group.rank,
        initialization_timeout=timeout_s,
    )
    return address


def leave_jax() -> None:
    """Shut JAX's distributed runtime down (a barrier of every process); call it before
    :meth:`Group.leave`, so that a peer lost meanwhile is still noticed."""
    import jax

    jax.distributed.shutdown()
