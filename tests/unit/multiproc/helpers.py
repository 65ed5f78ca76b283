"""A group whose members are threads of this process, over real loopback sockets."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from recovery.multiproc import Group, PeerLost, Topology, free_port, join

Losses = dict[int, PeerLost]


def topo(rank: int, size: int, port: int, group_id: str = "job") -> Topology:
    return Topology(rank=rank, size=size, rendezvous=("127.0.0.1", port), group_id=group_id)


def form_group(size: int, **kw: Any) -> tuple[list[Group], Losses]:
    """Join ``size`` members (threads); every member's losses land in one dict by rank.
    The caller ends them (``abort``) when done."""
    port = free_port()
    losses: Losses = {}

    def member(rank: int) -> Group:
        def lost(p: PeerLost) -> None:
            losses[rank] = p

        return join(topo(rank, size, port), on_lost=lost, **kw)

    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(member, range(size))), losses


def on_all(groups: list[Any], fn: Any) -> list[Any]:
    """``fn(member)`` for every member at once (collectives need them all), in order."""
    with ThreadPoolExecutor(len(groups)) as pool:
        return list(pool.map(fn, groups))
