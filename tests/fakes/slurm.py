"""An in-memory SlurmControl for unit tests of the coordinator's logic and for the decision
benchmark. A fake of our own port, never the proof that the Slurm adapter works (that is
tests/slurm against real daemons).

It follows the port's contract where the coordinator depends on it: take-outs keep someone
else's reason, return False when the state already holds, ``down`` requeues the requeueable
jobs on the node; every call that would change Slurm is logged in :attr:`FakeSlurm.calls`
(what ``scontrol update`` calls would have been made). ``latency_s`` makes each call sleep,
as a real slurmctld round trip does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from recovery.errors import ReasonNotOursError, SlurmUnavailableError, unknown_choice
from recovery.ports.slurm import BatchJob, JobInfo, NodeInfo, is_ours, mark
from recovery.spares import SPARE_REASON
from tests.helpers import Crash


class FakeSlurm:
    """Nodes ``nodes`` (in service) and ``spares`` (drained as spares) in partition ``main``."""

    def __init__(
        self,
        nodes: Sequence[str],
        spares: Sequence[str] = (),
        *,
        latency_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._nodes: dict[str, NodeInfo] = {
            n: NodeInfo(n, "IDLE", partitions=("main",)) for n in nodes
        }
        for s in spares:
            self._nodes[s] = NodeInfo(
                s, "IDLE", frozenset({"DRAIN"}), reason=SPARE_REASON, partitions=("main",)
            )
        self._jobs: dict[str, JobInfo] = {}
        self.calls: list[tuple[str, ...]] = []
        self.latency_s = latency_s
        self._sleep = sleep
        self.unavailable = 0
        """Fail this many next calls with SlurmUnavailableError (a slurmctld outage)."""
        self._lock = threading.Lock()
        self._next_job = 1
        self.crash_before: set[str] = set()
        """Raise :class:`Crash` (the coordinator killed) just before the named call runs."""

    # --- test controls --------------------------------------------------------------------

    def set_node(self, name: str, **changes: object) -> None:
        """Change a node as Slurm itself would (a crash, someone else's drain)."""
        self._nodes[name] = replace(self._nodes[name], **changes)  # type: ignore[arg-type]

    def run_job(self, nodes: Sequence[str], name: str = "train") -> str:
        """A running requeueable job on ``nodes``; returns its id."""
        job_id = str(self._next_job)
        self._next_job += 1
        self._jobs[job_id] = JobInfo(job_id, name, "RUNNING", tuple(nodes))
        for n in nodes:
            self.set_node(n, state="ALLOCATED")
        return job_id

    def start_job(self, job_id: str, nodes: Sequence[str]) -> None:
        """A pending job starts again on ``nodes`` (what the scheduler does after a requeue)."""
        self._jobs[job_id] = replace(self._jobs[job_id], state="RUNNING", nodes=tuple(nodes))

    def finish_job(self, job_id: str, state: str = "COMPLETED") -> None:
        self._jobs[job_id] = replace(self._jobs[job_id], state=state)

    def updates(self) -> list[tuple[str, ...]]:
        """The calls that changed Slurm (not the reads)."""
        return [c for c in self.calls if c[0] not in ("nodes", "jobs")]

    def _enter(self, op: str = "") -> None:
        # Every call pays the round trip, and fails before changing anything during an outage.
        if op in self.crash_before:
            self.crash_before.discard(op)
            raise Crash(f"the coordinator was killed before {op}")
        if self.latency_s:
            self._sleep(self.latency_s)
        with self._lock:
            if self.unavailable:
                self.unavailable -= 1
                raise SlurmUnavailableError("fake slurmctld unreachable")

    def _call(self, *what: str) -> None:
        self._enter(what[0])
        with self._lock:
            self.calls.append(what)

    def _log(self, *what: str) -> None:
        with self._lock:
            self.calls.append(what)

    # --- reading --------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        self._call("nodes")
        return [self._nodes[n] for n in sorted(self._nodes)]

    def node(self, name: str) -> NodeInfo:
        if name not in self._nodes:
            raise unknown_choice("node", name, self._nodes)
        return self._nodes[name]

    def jobs(self) -> list[JobInfo]:
        self._call("jobs")
        return list(self._jobs.values())

    def job(self, job_id: str | int) -> JobInfo:
        return self._jobs[str(job_id)]

    def jobs_on(self, node: str) -> list[JobInfo]:
        return [j for j in self._jobs.values() if node in j.nodes and j.state == "RUNNING"]

    # --- acting ---------------------------------------------------------------------------

    def _take_out(self, node: str, state: str, reason: str) -> bool:
        info = self.node(node)
        text = mark(reason)
        if info.held_by_other:
            return False
        held = info.down if state == "DOWN" else info.drained
        if held and info.reason == text:
            return False
        flags = info.flags | {"DRAIN"} if state == "DRAIN" else info.flags
        self._nodes[node] = replace(
            info, state="DOWN" if state == "DOWN" else info.state, flags=flags, reason=text
        )
        if state == "DOWN":
            for j in self.jobs_on(node):
                self._jobs[j.job_id] = replace(
                    j, state="PENDING", restart_count=j.restart_count + 1
                )
        return True

    def down(self, node: str, reason: str) -> bool:
        return bool(self.down_many([node], reason))

    def drain(self, node: str, reason: str) -> bool:
        return bool(self.drain_many([node], reason))

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        self._enter("down")
        changed = sorted(n for n in set(nodes) if self._take_out(n, "DOWN", reason))
        if changed:
            self._log("down", ",".join(changed), mark(reason))
        return changed

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        self._enter("drain")
        changed = sorted(n for n in set(nodes) if self._take_out(n, "DRAIN", reason))
        if changed:
            self._log("drain", ",".join(changed), mark(reason))
        return changed

    def resume(self, node: str, *, force: bool = False) -> bool:
        info = self.node(node)
        if not (info.down or info.drained):
            return False
        if not is_ours(info.reason) and not force:
            raise ReasonNotOursError(node, info.reason, info.reason_set_by)
        self._call("resume", node)
        self._nodes[node] = replace(
            info, state="IDLE", flags=info.flags - {"DRAIN", "NOT_RESPONDING"}, reason=""
        )
        return True

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        job = self._jobs.get(str(job_id))
        if job is None or job.state != "RUNNING":
            return False
        self._call("signal", str(job_id), signal)
        return True

    def requeue(self, job_id: str | int) -> bool:
        job = self._jobs[str(job_id)]
        if job.state == "PENDING":
            return False
        self._call("requeue", str(job_id))
        self._jobs[job.job_id] = replace(job, state="PENDING", restart_count=job.restart_count + 1)
        return True

    def submit(self, job: BatchJob) -> str:
        self._call("submit")
        return self.run_job([], name=str(job.options.get("job-name") or "job"))

    def cancel(self, job_id: str | int) -> bool:
        job = self._jobs.get(str(job_id))
        if job is None or job.finished:
            return False
        self._call("cancel", str(job_id))
        self._jobs[job.job_id] = replace(job, state="CANCELLED")
        return True
