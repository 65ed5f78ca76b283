"""The ``progress`` source: training jobs on this node that stopped making progress.

Every second the source reads the registry (:mod:`recovery.progress.registry`) for the
processes on this node that report progress, then each of their jobs' progress directories,
where every process of the job writes its record, those on other nodes too. A
:class:`~recovery.progress.StallWatch` per job learns its time per step and judges it; the
source lives in the agent, not in the job, so a process whose main thread is stuck, or that
is stopped whole, is judged all the same.

When a job is stalled the source writes the stacks of its processes on this node beside the
records (``<progress dir>/stacks/rank<r>.txt``, for whoever looks into the incident), and
reports at most one event per stall:

* ``rank-frozen`` / ``rank-hang``: the process that holds the others up runs here
  (attributed: frozen whole, or behind the others, or over its phase's budget); the message
  names the job, the rank, why, and where its main thread is;
* ``job-hang``: nobody can be named; reported by the agent of the job's lowest rank only, so
  that one event says it.

While the job progresses, a :class:`~recovery.progress.straggler.StragglerWatch` per job
compares its processes' own work per step: the agent of a process persistently slower than
its peers reports ``node-slow`` once per launch, with the slowdown and what it cost so far.

Nothing is reported for a process that is gone (its death is reported otherwise: its peers
stop, Slurm ends the step) nor for a job whose processes all ended cleanly.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.stacks import capture
from recovery.errors import UsageError
from recovery.model import HealthEvent, Source
from recovery.ports.clock import Clock
from recovery.proc import alive
from recovery.progress import Budgets, Record, StallWatch, Verdict, job_budgets, read_records
from recovery.progress.registry import Entry, entries, write_site_budgets
from recovery.progress.stacks import (
    STACKS,
    missing,
    supervised,
    write_slow_report,
    write_stacks,
)
from recovery.progress.straggler import Straggler, StragglerWatch

Log = Callable[[str], None]
INTERVAL_S = 1.0
#: The message's room for the culprit's stack (the event's message holds 2048 characters).
STACK_CHARS = 1200
#: Seconds the reporting agent waits for the other agents' stacks of the job before it
#: reports (its report gets the job requeued, which ends every process): each agent judges
#: the job on its own once a second, so theirs come within about a second.
STACKS_WAIT_S = 3.0


@dataclass
class _Job:
    key: tuple[tuple[int, int], ...]
    """(rank, pid) of the records the watch was built on: a relaunch starts a new watch."""
    watch: StallWatch
    reported: bool = False
    straggler: StragglerWatch = field(default_factory=StragglerWatch)
    slow_reported: bool = False
    """A straggler is reported once per launch ..."""
    move_pending: bool = False
    """... and once more (``node-slow-swap``) when a move the job asked for did not pay at
    first and does later."""


class ProgressSource:
    """See the module docstring. ``stacks(pid)`` reads a process's stacks (injected in tests)."""

    def __init__(
        self,
        node: str,
        clock: Clock,
        registry: Path,
        *,
        budgets: Budgets | None = None,
        stacks: Callable[[int], str] = capture,
        log: Log = print,
        agent_version: str = "",
    ) -> None:
        self.node = node
        self.clock = clock
        self.registry = registry
        self.budgets = self._base = budgets or Budgets()
        self._site: dict[str, Any] | None = None
        """The site's thresholds last heard (None: none yet: the first answer is always
        taken, so what an earlier agent left in the registry is replaced)."""
        self._stacks = stacks
        self._log = log
        self._version = agent_version
        self._jobs: dict[Path, _Job] = {}

    def use_site_budgets(self, changes: dict[str, Any]) -> None:
        """Judge jobs by the site's thresholds (the coordinator's policy ``progress``, from
        the heartbeat's answer) under their own: from each job's next launch on. Refused
        ones are logged and the agent's own defaults kept."""
        if changes == self._site:
            return
        try:
            budgets = self._base.overridden(changes, "the coordinator's progress thresholds")
        except UsageError as e:
            self._log(f"agent {self.node}: {e}; judging by the agent's own defaults")
        else:
            self.budgets = budgets
            if changes:
                self._log(f"agent {self.node}: the site's progress thresholds: {changes}")
            # For the in-allocation supervisors on this node, which hear no coordinator.
            if not write_site_budgets(self.registry, changes):
                self._log(f"agent {self.node}: cannot leave them in {self.registry}")
        self._site = dict(changes)

    def run(
        self,
        emit: Callable[[HealthEvent], None],
        stop: threading.Event,
        interval_s: float = INTERVAL_S,
    ) -> None:
        while not stop.wait(interval_s):
            for event in self.tick():
                emit(event)

    def tick(self) -> list[HealthEvent]:
        """One look at every job with a live process here; the events to report."""
        local: dict[Path, list[Entry]] = {}
        for entry in entries(self.registry):
            if entry.node != self.node:
                continue
            if not alive(entry.pid):
                entry.path.unlink(missing_ok=True)  # ended without saying so (killed)
                continue
            local.setdefault(entry.record.parent, []).append(entry)
        for gone in set(self._jobs) - set(local):
            del self._jobs[gone]
        out = []
        for directory, mine in local.items():
            event = self._look(directory, mine)
            if event is not None:
                out.append(event)
        return out

    def _look(self, directory: Path, mine: list[Entry]) -> HealthEvent | None:
        records = _current(read_records(directory))
        pids = {e.pid for e in mine}
        # This node's processes (pids repeat across nodes: the node named in the record too).
        here = {r: rec for r, rec in records.items() if rec.pid in pids and rec.node == self.node}
        if not here:
            return None
        key = tuple(sorted((r, rec.pid) for r, rec in records.items()))
        job = self._jobs.get(directory)
        if job is None or job.key != key:
            budgets, error = job_budgets(directory, self.budgets)
            if error is not None:
                self._log(f"agent {self.node}: {error}")
            job = self._jobs[directory] = _Job(
                key, StallWatch(budgets), straggler=StragglerWatch(budgets.straggler)
            )
        now = self.clock.now().wall
        verdict = job.watch.observe(records, now)
        if not verdict.stalled:
            job.reported = False
            return self._straggler(directory, mine[0].job, job, records, here, now)
        if job.reported:
            return None
        job.reported = True
        stacks = {r: self._dump(directory, rec) for r, rec in here.items()}
        event = self._event(directory, mine[0].job, verdict, records, here, stacks, now)
        if event is not None:
            absent = self._await_stacks(directory, records, now)
            if absent:
                event = event.model_copy(
                    update={"message": f"{event.message[:1900]} (no stacks of rank "
                            f"{', '.join(map(str, absent))}: its agent did not answer within "
                            f"{STACKS_WAIT_S:g} s)"}
                )  # fmt: skip
        return event

    def _straggler(
        self,
        directory: Path,
        slurm_job: str,
        job: _Job,
        records: dict[int, Record],
        here: dict[int, Record],
        now: float,
    ) -> HealthEvent | None:
        """``node-slow`` when the job's straggler runs here (once per launch); for a job that
        asked to be moved off a straggler, ``node-slow-swap`` once the move pays (at once, or
        on a later look: a straggler found early is measured over a window still half
        healthy, and what the move saves grows as the window fills)."""
        found = job.straggler.observe(records)
        if found is None or found.rank not in here:
            return None  # none, or another node's agent tells it
        if job.slow_reported and not job.move_pending:
            return None  # told already
        config = job.straggler.config
        if config.swap and supervised(directory):
            move, why = False, "its supervisor moves it off the node inside its allocation"
        else:
            move, why = config.requeue_swap(found)
        first = not job.slow_reported
        job.slow_reported = True
        job.move_pending = (
            not move and config.swap and 0 < found.step < config.until_step
            and not supervised(directory)
        )  # fmt: skip
        if not first and not move:
            return None
        name = f"job {slurm_job}" if slurm_job else f"the job in {directory}"
        event = self._slow_event(name, found, records, now, move, why if config.swap else "")
        try:  # for the job's supervisor, which waits for it before it swaps the node out
            write_slow_report(directory, records[found.rank], event.message, now)
        except OSError as e:
            self._log(f"agent {self.node}: cannot keep the slow report in {directory}: {e}")
        return event

    def _slow_event(
        self,
        job: str,
        found: Straggler,
        records: dict[int, Record],
        now: float,
        move: bool = False,
        why: str = "",
    ) -> HealthEvent:
        """``node-slow``; ``node-slow-swap`` when ``move``: the job asked to be moved off a
        straggler and that pays on the requeue path (``why`` says by how much)."""
        message = f"{job}: {found.describe()} (at step {found.step})" + (f"; {why}" if why else "")
        fault = "node-slow-swap" if move else "node-slow"
        digest = hashlib.sha256(
            f"slow|{sorted(r.pid for r in records.values())}|{found.rank}|{move}".encode()
        ).hexdigest()[:16]
        self._log(f"agent {self.node}: {fault}: {message[:300]}")
        return HealthEvent(
            id=f"{self.node}-slow-{digest}",
            node=self.node,
            source=Source.progress,
            fault=fault,
            observed_at=now,
            message=message[:2048],
            agent_version=self._version,
        )

    def _await_stacks(self, directory: Path, records: dict[int, Record], since: float) -> list[int]:
        """Wait (at most :data:`STACKS_WAIT_S`) until every process of the job has stacks
        taken around ``since``; the ranks still missing."""
        deadline = time.monotonic() + STACKS_WAIT_S
        while True:
            absent = missing(directory, sorted(records), since)
            if not absent or time.monotonic() > deadline:
                return absent
            time.sleep(0.1)

    def _dump(self, directory: Path, rec: Record) -> str:
        text = self._stacks(rec.pid)
        try:
            write_stacks(directory, rec, text, self.clock.now().wall)
        except OSError as e:
            self._log(f"agent {self.node}: cannot keep the stacks in {directory / STACKS}: {e}")
        return text

    def _event(
        self,
        directory: Path,
        slurm_job: str,
        verdict: Verdict,
        records: dict[int, Record],
        here: dict[int, Record],
        stacks: dict[int, str],
        now: float,
    ) -> HealthEvent | None:
        job = f"job {slurm_job}" if slurm_job else f"the job in {directory}"
        culprits = [c for c in verdict.culprits if c.node == self.node and c.rank in here]
        if verdict.confident and culprits:
            c = culprits[0]
            fault = "rank-frozen" if c.why.startswith("frozen") else "rank-hang"
            stack = _main_stack(stacks.get(c.rank, ""))
            message = (
                f"{job}: rank {c.rank} (pid {c.pid}) {c.why}; no step for {verdict.idle_s:.1f} s "
                f"(budget {verdict.budget_s:.1f} s) at step {verdict.step}. Stacks of its "
                f"processes here: {directory / STACKS}. Main thread: {stack}"
            )
        elif not verdict.confident and min(records) in here:
            fault = "job-hang"
            message = (
                f"{job}: no step for {verdict.idle_s:.1f} s (budget {verdict.budget_s:.1f} s) at "
                f"step {verdict.step}; {verdict.why}. Stacks: {directory / STACKS}"
            )
        else:
            return None  # the culprit's own agent (or the lowest rank's) reports it
        digest = hashlib.sha256(
            f"{directory}|{sorted(r.pid for r in records.values())}|{verdict.step}".encode()
        ).hexdigest()[:16]
        self._log(f"agent {self.node}: {fault}: {message[:300]}")
        return HealthEvent(
            id=f"{self.node}-progress-{digest}",
            node=self.node,
            source=Source.progress,
            fault=fault,
            observed_at=now,
            message=message[:2048],
            agent_version=self._version,
        )


def _current(records: dict[int, Record]) -> dict[int, Record]:
    """The records of the job's present launch: the size most of them give (a launch with
    fewer processes leaves the higher ranks' files behind), ranks below it."""
    if not records:
        return records
    sizes = [rec.size for rec in records.values()]
    size = max(set(sizes), key=lambda s: (sizes.count(s), s))
    return {r: rec for r, rec in records.items() if rec.size == size and r < size}


def _main_stack(text: str) -> str:
    """The main thread's frames from a py-spy dump (all of it when it is not one)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "MainThread" in line), None)
    if start is None:
        return " | ".join(lines)[:STACK_CHARS]
    frames = []
    for line in lines[start + 1 :]:
        if line.startswith("Thread "):
            break
        frames.append(line.strip())
    return " <- ".join(frames)[:STACK_CHARS] or "(no frames)"
