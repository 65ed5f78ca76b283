"""Fencing: Slurm and Kubernetes as a replica's engine sees them, each action asked of the
election first (:meth:`recovery.coordinator.leader.Elector.fence`). Reads pass through; every
call that changes Slurm or Kubernetes raises :class:`~recovery.coordinator.leader.Deposed`
instead once this replica may no longer act, so a leader that lost its lease mid-incident
stops at its next action, and the action stays planned in the journal for the next leader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from recovery.ports.checks import BurnIn, BurnInOutcome
from recovery.ports.nodes import KubeNode, NodeControl
from recovery.ports.slurm import BatchJob, JobInfo, NodeInfo, SlurmControl

Fence = Callable[[str], None]


class FencedSlurm:
    """A SlurmControl whose every write is fenced."""

    def __init__(self, inner: SlurmControl, fence: Fence) -> None:
        self.inner = inner
        self._fence = fence

    # Reads
    def nodes(self) -> list[NodeInfo]:
        return self.inner.nodes()

    def node(self, name: str) -> NodeInfo:
        return self.inner.node(name)

    def jobs(self) -> list[JobInfo]:
        return self.inner.jobs()

    def job(self, job_id: str | int) -> JobInfo:
        return self.inner.job(job_id)

    def jobs_on(self, node: str) -> list[JobInfo]:
        return self.inner.jobs_on(node)

    # Writes
    def down(self, node: str, reason: str) -> bool:
        self._fence(f"down {node}")
        return self.inner.down(node, reason)

    def drain(self, node: str, reason: str) -> bool:
        self._fence(f"drain {node}")
        return self.inner.drain(node, reason)

    def resume(self, node: str, *, force: bool = False) -> bool:
        self._fence(f"resume {node}")
        return self.inner.resume(node, force=force)

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        self._fence(f"down {','.join(nodes)}")
        return self.inner.down_many(nodes, reason)

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        self._fence(f"drain {','.join(nodes)}")
        return self.inner.drain_many(nodes, reason)

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        self._fence(f"signal {signal} to job {job_id}")
        return self.inner.signal_job(job_id, signal)

    def requeue(self, job_id: str | int) -> bool:
        self._fence(f"requeue job {job_id}")
        return self.inner.requeue(job_id)

    def requeue_ended(self, job_id: str | int, restart_count: int) -> bool:
        self._fence(f"requeue job {job_id}")
        return self.inner.requeue_ended(job_id, restart_count)

    def submit(self, job: BatchJob) -> str:
        self._fence(f"submit job {job.options.get('job-name') or job.script}")
        return self.inner.submit(job)

    def cancel(self, job_id: str | int) -> bool:
        self._fence(f"cancel job {job_id}")
        return self.inner.cancel(job_id)


class FencedNodes:
    """A NodeControl whose every write is fenced."""

    def __init__(self, inner: NodeControl, fence: Fence) -> None:
        self.inner = inner
        self._fence = fence

    def nodes(self) -> list[KubeNode]:
        return self.inner.nodes()

    def watch(self, stop: Callable[[], bool]) -> Iterator[KubeNode]:
        return self.inner.watch(stop)

    def mark_unhealthy(self, node: str, fault: str, incident: str) -> bool:
        self._fence(f"mark Kubernetes node {node}")
        return self.inner.mark_unhealthy(node, fault, incident)

    def clear_marks(self, node: str) -> bool:
        self._fence(f"clear the marks of Kubernetes node {node}")
        return self.inner.clear_marks(node)

    def delete_slurmd_pods(self, node: str) -> list[str]:
        self._fence(f"remove the slurmd pods of {node}")
        return self.inner.delete_slurmd_pods(node)

    def request_operator_drain(self, node: str, incident: str) -> list[str]:
        self._fence(f"ask the operator to drain {node}")
        return self.inner.request_operator_drain(node, incident)

    def withdraw_operator_drain(self, node: str) -> list[str]:
        self._fence(f"withdraw the operator's drain of {node}")
        return self.inner.withdraw_operator_drain(node)

    def promote_spare(self, node: str) -> bool:
        self._fence(f"promote {node}")
        return self.inner.promote_spare(node)

    def retire_spare(self, node: str) -> bool:
        self._fence(f"return {node} to the pool")
        return self.inner.retire_spare(node)


class FencedBurnIn:
    """A BurnIn that asks before it takes a node into a job (it changes Slurm: the node is
    put in service for the burn-in and back out after)."""

    def __init__(self, inner: BurnIn, fence: Fence) -> None:
        self.inner = inner
        self._fence = fence

    def run(
        self,
        node: str,
        budget_s: float,
        restore_reason: str,
        expect_devices: int | None = None,
        peer: tuple[str, str] | None = None,
    ) -> BurnInOutcome:
        self._fence(f"burn-in of {node}")
        return self.inner.run(node, budget_s, restore_reason, expect_devices, peer)

    def cleanup(self, restore_reasons: Mapping[str, str]) -> list[str]:
        self._fence("put back nodes left in a burn-in")
        return self.inner.cleanup(restore_reasons)
