"""An in-memory NodeControl for unit tests of the coordinator's Kubernetes steps. A fake of our
own port, never the proof that the adapter works (tests/k8s does that on a real API server).

It keeps the port's contract where the coordinator depends on it: every action is idempotent
and returns whether it changed anything; an unknown node raises KubeNotFoundError (except
where gone means done); ``unavailable`` fails the next calls transiently. Every call that
changed something is logged in :attr:`FakeNodes.calls`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from recovery.errors import KubeForbiddenError, KubeNotFoundError, KubeUnavailableError
from recovery.ports.nodes import KubeNode, OurCondition, condition_reason


class FakeNodes:
    """Kubernetes nodes named like the Slurm ones, each with one slurmd pod ``slurmd-NAME``."""

    def __init__(self, names: Sequence[str]) -> None:
        self._nodes = {n: KubeNode(n, ready="True", pods=(f"slurmd-{n}",)) for n in names}
        self.calls: list[tuple[str, ...]] = []
        self.unavailable = 0
        """Fail this many next calls with KubeUnavailableError (an API server outage)."""
        self.forbidden: set[str] = set()
        """Method names that raise as if RBAC refused them."""

    def _enter(self, op: str) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise KubeUnavailableError("fake API server unreachable")
        if op in self.forbidden:
            raise KubeForbiddenError(f"{op}: forbidden (403)")

    def _get(self, name: str) -> KubeNode:
        if name not in self._nodes:
            raise KubeNotFoundError(f"get nodes {name}: not found (404)")
        return self._nodes[name]

    def node(self, name: str) -> KubeNode:
        return self._nodes[name]

    def changes(self) -> list[tuple[str, ...]]:
        return list(self.calls)

    # --- the port -------------------------------------------------------------------------

    def nodes(self) -> list[KubeNode]:
        self._enter("nodes")
        return [self._nodes[n] for n in sorted(self._nodes)]

    def mark_unhealthy(self, node: str, fault: str, incident: str) -> bool:
        self._enter("mark_unhealthy")
        n = self._get(node)
        want = replace(
            n,
            unschedulable=True,
            cordoned_by_us=n.cordoned_by_us or not n.unschedulable,
            our_taint="NoSchedule",
            condition=OurCondition("False", condition_reason(fault), incident),
            incident=incident,
            spare=False,
            promoted=False,
        )
        return self._set(node, want, ("mark", node, fault, incident))

    def clear_marks(self, node: str) -> bool:
        self._enter("clear_marks")
        if node not in self._nodes:
            return False
        n = self._nodes[node]
        want = replace(
            n,
            unschedulable=n.unschedulable and not n.cordoned_by_us,
            cordoned_by_us=False,
            our_taint=None,
            condition=None,
            incident="",
        )
        return self._set(node, want, ("clear", node))

    def delete_slurmd_pods(self, node: str) -> list[str]:
        self._enter("delete_slurmd_pods")
        if node not in self._nodes or not self._nodes[node].pods:
            return []
        pods = list(self._nodes[node].pods)
        self._set(node, replace(self._nodes[node], pods=()), ("delete-pods", node))
        return pods

    def request_operator_drain(self, node: str, incident: str) -> list[str]:
        self._enter("request_operator_drain")
        self.calls.append(("pod-cordon", node, incident))
        return list(self._get(node).pods)

    def withdraw_operator_drain(self, node: str) -> list[str]:
        self._enter("withdraw_operator_drain")
        self.calls.append(("pod-uncordon", node))
        return list(self._get(node).pods)

    def promote_spare(self, node: str) -> bool:
        self._enter("promote_spare")
        n = self._get(node)
        return self._set(node, replace(n, spare=False, promoted=True), ("promote", node))

    def retire_spare(self, node: str) -> bool:
        self._enter("retire_spare")
        n = self._get(node)
        return self._set(node, replace(n, spare=True, promoted=False), ("retire", node))

    def watch(self, stop: Callable[[], bool]) -> Iterator[KubeNode]:
        yield from self.nodes()

    def _set(self, name: str, want: KubeNode, call: tuple[str, ...]) -> bool:
        if self._nodes[name] == want:
            return False
        self._nodes[name] = want
        self.calls.append(call)
        return True
