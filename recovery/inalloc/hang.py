"""The supervisor's watch on its own launch: has it stopped making progress?

The supervisor runs in the batch step, beside no training process of its own (the batch host
is the last spare used), and reads the records every process of the launch writes in the
run's progress folder (:mod:`recovery.progress.record`), the same ones the node agents judge.
So a process whose main thread is stuck, or that is stopped whole, is seen from outside it,
and the supervisor can end the launch and start the next one inside the allocation instead
of the job being requeued.

Only the records of the present launch count: the processes of an ended launch leave theirs
behind until the new ones replace them, and every time in a new record is later than the
launch (a process writes its record once it has its rank). :data:`CLOCK_SLACK_S` allows for
the nodes' clocks differing a little from the batch host's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from recovery.progress import Budgets, Record, StallWatch, Verdict, job_budgets, read_records
from recovery.progress.straggler import Straggler, StragglerConfig, StragglerWatch

#: Seconds a node's clock may be behind the batch host's for its records still to count.
CLOCK_SLACK_S = 1.0
#: Seconds between two looks at the records.
LOOK_EVERY_S = 0.5


@dataclass
class LaunchWatch:
    """One launch's progress, judged by a :class:`~recovery.progress.StallWatch`."""

    directory: Path
    """The run's progress folder."""
    processes: int
    launched_at: float
    """When the launch began (Unix seconds, the batch host's clock)."""
    budgets: Budgets = field(default_factory=Budgets)
    """The defaults; the job's own (``budgets.json`` beside the records) go over them."""
    error: str | None = None
    """Why the job's own budgets were not taken, when they were there and could not be."""
    straggler: Straggler | None = None
    """The launch's persistently slow process at the last look (None: none)."""
    first_step_at: float | None = None
    """When the launch first finished a step (Unix seconds): a relaunch's cost ends there."""
    _watch: StallWatch | None = None
    _slow: StragglerWatch | None = None

    def records(self) -> dict[int, Record]:
        """The launch's own records, by rank (missing ones: not written yet)."""
        since = self.launched_at - CLOCK_SLACK_S
        return {
            r: rec
            for r, rec in read_records(self.directory).items()
            if r < self.processes
            and rec.size == self.processes
            and max(rec.phase_since, rec.step_finished_at) >= since
        }

    @property
    def straggler_rule(self) -> StragglerConfig:
        """The slow-process rule in force (the job's own once read)."""
        return self._slow.config if self._slow is not None else self.budgets.straggler

    def look(self, now: float) -> Verdict:
        """The launch's state at ``now`` (Unix seconds); :attr:`straggler` too."""
        records = self.records()
        if self._watch is None or self._slow is None:
            if 0 not in records:  # it keeps the job's budgets before its record
                return Verdict("unwatched", "process 0 of the launch has not reported yet")
            budgets, self.error = job_budgets(self.directory, self.budgets)
            self._watch, self._slow = StallWatch(budgets), StragglerWatch(budgets.straggler)
        finished = [rec.step_finished_at for rec in records.values() if rec.step_finished >= 0]
        if self.first_step_at is None and finished:
            self.first_step_at = min(finished)
        verdict = self._watch.observe(records, now)
        self.straggler = None if verdict.stalled else self._slow.observe(records)
        return verdict
