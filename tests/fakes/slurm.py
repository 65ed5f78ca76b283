"""An in-memory SlurmControl for unit tests of the coordinator's logic and for the decision
benchmark. A fake of our own port, never the proof that the Slurm adapter works (that is
tests/slurm against real daemons).

Our rules are not copied here: what a take-out writes, when a resume is ours to make, which
jobs use a node and when a requeue is a no-op are the pure functions of ``slurm.control``
that the real backends use (``take_out_plan``, ``resume_needed``, ``JobInfo.uses``,
``requeue_needed``). What the fake adds is only Slurm's side, what slurmctld does with a
request once it is sent (:meth:`FakeSlurm.scontrol_update`, :meth:`FakeSlurm.scontrol_resume`),
and tests/slurm/test_port_contract.py runs the same cases against this fake and the real
daemons to keep the two alike.

Every call that would change Slurm is logged in :attr:`FakeSlurm.calls` (what ``scontrol
update`` calls would have been made: one per reason written). ``latency_s`` makes each call
sleep, as a real slurmctld round trip does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from recovery.errors import SlurmRefusedError, SlurmUnavailableError, UsageError, unknown_choice
from recovery.pool.spares import SPARE_REASON
from recovery.ports.slurm import (
    BatchJob,
    JobInfo,
    NodeInfo,
    mark,
    validate_job_id,
    validate_node_name,
)
from slurm.control import (
    release_held_needed,
    requeue_ended_needed,
    requeue_needed,
    resume_needed,
    take_out_plan,
)
from tests.helpers import Crash


class FakeSlurm:
    """Nodes ``nodes`` (in service) and ``spares`` (drained as spares) in partition ``main``.

    ``user`` is who the fake's caller acts as: the ``reason_set_by`` of what it writes (root,
    as the coordinator on the local cluster)."""

    def __init__(
        self,
        nodes: Sequence[str],
        spares: Sequence[str] = (),
        *,
        latency_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        user: str = "root",
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
        self.user = user
        self.unavailable = 0
        """Fail this many next calls with SlurmUnavailableError (a slurmctld outage)."""
        self._lock = threading.Lock()
        self._next_job = 1
        self.crash_before: set[str] = set()
        """Raise :class:`Crash` (the coordinator killed) just before the named call runs."""
        self.wall: Callable[[], float] = time.time
        """Slurm's clock (Unix seconds): when jobs end. Tests point it at their fake clock."""

    # --- test controls: Slurm itself, or someone else ---------------------------------------

    def set_node(self, name: str, **changes: object) -> None:
        """Change a node as Slurm itself would (a crash, someone else's drain)."""
        self._nodes[name] = replace(self._nodes[name], **changes)  # type: ignore[arg-type]

    def set_job(self, job_id: str, **changes: object) -> None:
        """Change a job as Slurm itself would (a requeue seen half way, a state it reached)."""
        self._jobs[job_id] = replace(self._jobs[job_id], **changes)  # type: ignore[arg-type]

    def scontrol_update(
        self, nodes: Sequence[str], state: str, reason: str, *, by: str | None = None
    ) -> None:
        """What slurmctld does with ``scontrol update NodeName=... State=DOWN|DRAIN
        Reason=...`` sent by ``by`` (default :attr:`user`), with no rule of ours: the raw
        request behind our take-outs, and someone else's drain or DOWN in a test.

        DRAIN adds the flag and keeps the base state (running jobs go on); DOWN sets the base
        state, keeps the flags, requeues the requeueable jobs on the node and ends the others
        NODE_FAIL (killed by SIGTERM). Either way the reason is ``reason``, set by ``by``.
        """
        who = self.user if by is None else by
        for name in nodes:
            info = self._nodes[name]
            if state == "DOWN":
                self._nodes[name] = replace(info, state="DOWN", reason=reason, reason_set_by=who)
                for j in [j for j in self._jobs.values() if j.uses(name)]:
                    if j.requeueable:
                        self._requeued(j)
                    else:
                        self.finish_job(j.job_id, "NODE_FAIL", exit_code=0, signal=15)
            elif state == "DRAIN":
                self._nodes[name] = replace(
                    info, flags=info.flags | {"DRAIN"}, reason=reason, reason_set_by=who
                )
            else:
                raise ValueError(f"state {state!r}: expected DOWN or DRAIN")

    def scontrol_resume(self, node: str) -> None:
        """What slurmctld does with ``State=RESUME``: DOWN becomes IDLE, DRAIN goes (a node
        with jobs stays ALLOCATED), the reason is cleared. Whoever asks."""
        info = self._nodes[node]
        self._nodes[node] = replace(
            info,
            state="IDLE" if info.down else info.state,
            flags=info.flags - {"DRAIN", "NOT_RESPONDING"},
            reason="",
            reason_set_by="",
        )

    def run_job(
        self,
        nodes: Sequence[str],
        name: str = "train",
        *,
        requeueable: bool = True,
        comment: str = "",
    ) -> str:
        """A running job on ``nodes`` (requeueable unless said otherwise); returns its id."""
        job_id = str(self._next_job)
        self._next_job += 1
        self._jobs[job_id] = JobInfo(
            job_id, name, "RUNNING", tuple(nodes), requeueable=requeueable, comment=comment
        )
        for n in nodes:
            self.set_node(n, state="ALLOCATED")
        return job_id

    def start_job(self, job_id: str, nodes: Sequence[str]) -> None:
        """A pending job starts again on ``nodes`` (what the scheduler does after a requeue)."""
        self._jobs[job_id] = replace(
            self._jobs[job_id], state="RUNNING", nodes=tuple(nodes), end_time=0.0
        )

    def finish_job(
        self,
        job_id: str,
        state: str = "COMPLETED",
        *,
        exit_code: int | None = None,
        signal: int | None = None,
        end_time: float | None = None,
    ) -> None:
        """The job ends in ``state`` at ``end_time`` (default: :attr:`wall` now), keeping the
        nodes it ran on; ``exit_code`` defaults to 0 for COMPLETED and 1 otherwise."""
        code = exit_code if exit_code is not None else (0 if state == "COMPLETED" else 1)
        self._jobs[job_id] = replace(
            self._jobs[job_id],
            state=state,
            exit_code=code,
            signal=signal,
            end_time=self.wall() if end_time is None else end_time,
        )

    def fail_job(self, job_id: str, exit_code: int = 134, *, signal: int | None = None) -> None:
        """The job's batch script ends with ``exit_code`` (134: the training process died of
        SIGABRT, as on a lost GPU), or killed by ``signal``: FAILED now."""
        self.finish_job(job_id, "FAILED", exit_code=exit_code, signal=signal)

    def fail_held(self, job_id: str, exit_code: int = 134) -> None:
        """The job's batch script fails and Slurm 25.11 requeues it expedited but holds it
        (no Epilog failed): REQUEUE_HOLD, restart count + 1, no nodes, the status kept."""
        job = self._jobs[job_id]
        self._jobs[job_id] = replace(
            job, state="REQUEUE_HOLD", nodes=(), restart_count=job.restart_count + 1,
            exit_code=exit_code, end_time=0.0, reason="JobHeldUser",
        )  # fmt: skip

    def updates(self) -> list[tuple[str, ...]]:
        """The calls that changed Slurm (not the reads)."""
        return [c for c in self.calls if c[0] not in ("nodes", "jobs")]

    def _requeued(self, job: JobInfo) -> None:
        # As slurmctld: a pending job lists no nodes (the last run's exit status stays).
        self._jobs[job.job_id] = replace(
            job, state="PENDING", nodes=(), restart_count=job.restart_count + 1, end_time=0.0
        )

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
        validate_node_name(name)
        if name not in self._nodes:
            raise unknown_choice("node", name, self._nodes)
        return self._nodes[name]

    def jobs(self) -> list[JobInfo]:
        self._call("jobs")
        return list(self._jobs.values())

    def job(self, job_id: str | int) -> JobInfo:
        jid = validate_job_id(job_id)
        if jid not in self._jobs:
            raise UsageError(f"Unknown job {jid}: slurmctld does not know it (finished long ago?)")
        return self._jobs[jid]

    def jobs_on(self, node: str) -> list[JobInfo]:
        self.node(node)
        return [j for j in self._jobs.values() if j.uses(node)]

    # --- acting: our rules from slurm.control, Slurm's side above ---------------------------

    def down(self, node: str, reason: str) -> bool:
        return bool(self.down_many([node], reason))

    def drain(self, node: str, reason: str) -> bool:
        return bool(self.drain_many([node], reason))

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        return self._take_out_many("down", nodes, reason)

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        return self._take_out_many("drain", nodes, reason)

    def _take_out_many(self, op: str, nodes: Sequence[str], reason: str) -> list[str]:
        text = mark(reason)
        for n in nodes:
            validate_node_name(n)
        self._enter(op)
        unknown = [n for n in nodes if n not in self._nodes]
        if unknown:
            raise unknown_choice("node", unknown[0], self._nodes)
        state = op.upper()
        changed: list[str] = []
        # One request per reason written, as the real backends send them.
        for why, names in take_out_plan((self._nodes[n] for n in nodes), state, text).items():
            self.scontrol_update(names, state, why)
            self._log(op, ",".join(names), why)
            changed += names
        return sorted(changed)

    def resume(self, node: str, *, force: bool = False) -> bool:
        if not resume_needed(self.node(node), force=force):
            return False
        self._call("resume", node)
        self.scontrol_resume(node)
        return True

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        job = self._jobs.get(validate_job_id(job_id))
        if job is None or job.state != "RUNNING":
            return False
        self._call("signal", job.job_id, signal)
        return True

    def requeue(self, job_id: str | int) -> bool:
        job = self.job(job_id)
        if not requeue_needed(job):
            return False
        self._call("requeue", job.job_id)
        self._scontrol_requeue(job)
        return True

    def requeue_ended(self, job_id: str | int, restart_count: int) -> bool:
        job = self.job(job_id)
        if release_held_needed(job, restart_count):
            self._call("release", job.job_id)
            self._jobs[job.job_id] = replace(job, state="PENDING", reason="")
            return True
        if not requeue_ended_needed(job, restart_count):
            return False
        self._call("requeue", job.job_id)
        self._scontrol_requeue(job)
        return True

    def _scontrol_requeue(self, job: JobInfo) -> None:
        # What slurmctld answers a requeue of a --no-requeue job.
        if not job.requeueable:
            raise SlurmRefusedError(
                f"scontrol requeue {job.job_id}: refused: Requested operation is presently "
                f"disabled for job {job.job_id}"
            )
        self._requeued(job)

    def submit(self, job: BatchJob) -> str:
        self._call("submit")
        return self.run_job([], name=str(job.options.get("job-name") or "job"))

    def cancel(self, job_id: str | int) -> bool:
        job = self._jobs.get(validate_job_id(job_id))
        if job is None or job.finished:
            return False
        self._call("cancel", job.job_id)
        self._jobs[job.job_id] = replace(job, state="CANCELLED")
        return True
