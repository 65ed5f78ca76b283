"""Which spare to promote: one in the failed node's topology group (rack, NVLink domain) first,
then any, each by name."""

from __future__ import annotations

from collections.abc import Sequence

from recovery.policy.config import PolicyConfig
from recovery.ports.slurm import NodeInfo


def topology_group(node: NodeInfo | str, config: PolicyConfig) -> str | None:
    """The node's group: from ``config.spares.groups``, else from its first (sorted) Slurm
    feature starting with ``config.spares.feature_prefix``; None when neither says."""
    name = node if isinstance(node, str) else node.name
    topo = config.spares
    if name in topo.groups:
        return topo.groups[name]
    if isinstance(node, str) or not topo.feature_prefix:
        return None
    prefix = topo.feature_prefix
    matches = sorted(f for f in node.features if f.startswith(prefix))
    return matches[0] if matches else None


def choose_spare(
    ready: Sequence[NodeInfo], failed: str | NodeInfo, config: PolicyConfig
) -> NodeInfo | None:
    """The spare to promote for ``failed`` among ``ready`` (None when there is none).

    Pass ``failed`` as a NodeInfo to let its Slurm features name its group.
    """
    if not ready:
        return None
    group = topology_group(failed, config)

    def rank(spare: NodeInfo) -> tuple[bool, str]:
        same = group is not None and topology_group(spare, config) == group
        return (not same, spare.name)

    return min(ready, key=rank)
