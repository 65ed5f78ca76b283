"""The job supervisor: runs in the batch step of a ``--no-kill`` job that holds K training
nodes and S spares, launches the training step, and on a lost node relaunches it on a spare
inside the same allocation instead of requeueing the job.

How it learns of a bad node: through slurmctld. When the coordinator (or an operator) sets
a node DOWN, Slurm drops it from the ``--no-kill`` job and ends the step's tasks there; the
other processes stop within moments (exit 76) and the step ends. A DRAIN node stays in the
job, so the supervisor gives it back (``release``). So the job needs no coordinator address
and a coordinator restart loses nothing. A step that ends while no node is reported lost
within ``grace_s`` is the training code's failure: the job ends with its status.

Every step, loss and decision is appended to a JSON-lines journal (one object a line,
``event`` and ``unix`` always set); the final decision is also written to a small file the
batch script reads (``exit N`` or ``requeue``), so a supervisor that dies without writing it
(killed mid-relaunch) makes the script requeue the job: nothing is lost, the checkpoints are
on shared storage.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from recovery.errors import RecoverError
from recovery.inalloc.decide import (
    DEFAULT_MAX_RELAUNCHES,
    Finish,
    Layout,
    Relaunch,
    Requeue,
    StepDecision,
    after_hang,
    after_signalled_step,
    after_slow,
    after_step,
    checked_status,
    ended_cleanly,
    first_layout,
    leave_step,
    lost_among,
    lost_wait_over,
    next_layout,
    status_after_leaving,
    swap_gain,
    time_limit_warning,
    usr1_about,
)
from recovery.inalloc.hang import LOOK_EVERY_S, LaunchWatch
from recovery.inalloc.vetting import Vetting
from recovery.pool.validate import NodeCheck
from recovery.progress import Budgets, Verdict
from recovery.progress.stacks import mark_supervised, missing, slow_reported, unmark_supervised

#: Seconds the supervisor waits, after a failed step, for Slurm to name a lost node.
DEFAULT_GRACE_S = 30.0
#: Seconds a launch runs before standbys are started on the job's nodes for the next one
#: (not at once: on a shared machine they would slow the launch they are not for).
DEFAULT_STANDBY_AFTER_S = 5.0
#: How often Slurm is asked while waiting (seconds).
POLL_S = 0.25
#: How often a running launch is looked at: its end, a signal the batch script forwarded.
STEP_POLL_S = 0.1
#: Seconds a stalled launch is kept, at most, for the node agents to take its processes'
#: stacks (they judge the job about when the supervisor does, and each writes its own).
STACKS_WAIT_S = 3.0
#: Seconds a swap waits, at most, for the slow node's agent to report it: the agents look
#: once a second and need as many looks in a row as the supervisor, which looks twice as often.
SLOW_REPORT_WAIT_S = 6.0
#: What a relaunch is taken to cost (seconds from the decision to the next first step) until
#: the job measured one of its own: on standbys that are up, 3 to 4 s were measured here
#: (benchmarks/hang_bench.py, in-allocation); a larger model restores and compiles longer.
RELAUNCH_COST_S = 10.0
#: Seconds between two judgements of a straggler whose swap did not pay yet: found early, its
#: excess is measured over a window still half healthy, and it grows as the window fills.
SLOW_REJUDGE_S = 5.0


class Step(Protocol):
    """A running launch of the training (one srun step per process)."""

    pid: int
    warm: list[str]
    """The nodes whose process was a standby already up when the launch came."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the launch ends: its exit status (128+n for a signal); None when
        ``timeout`` seconds pass first."""

    def signal(self, signum: int) -> None:
        """Forward ``signum`` to the step (srun passes it to every process)."""

    def end(self) -> None:
        """End every process of the launch now, whatever it is doing (stopped, or stuck in
        a system call): :meth:`wait` then returns its status."""


class JobSlurm(Protocol):
    """What the supervisor asks of Slurm about its own job."""

    def job_nodes(self) -> list[str]:
        """The nodes the job holds now, in Slurm's order."""

    def bad_nodes(self, nodes: Sequence[str]) -> list[str]:
        """Of ``nodes``, those Slurm reports DOWN, DRAIN, FAIL or not responding."""

    def release(self, keep: Sequence[str]) -> None:
        """Shrink the job to ``keep`` (``scontrol update JobId= NodeList=``)."""

    def launch(self, nodes: Sequence[str], command: Sequence[str]) -> Step:
        """Start ``command`` as one process per node on ``nodes`` (the first runs process 0),
        handing each node's standby its rank where one is up."""

    def warm(self, nodes: Sequence[str], command: Sequence[str]) -> list[str]:
        """Start a standby process of ``command`` on each of ``nodes`` that has none; the
        nodes where one was started."""

    def close(self) -> None:
        """End the standbys (the job is over)."""

    def time_left(self) -> float | None:
        """Seconds before the job's time limit; None: no limit (or unknown)."""

    def hold(self, node: str, reason: str) -> None:
        """Take ``node`` out of service with ``reason`` (a drain); RecoverError when Slurm
        refuses (the job's user is not a Slurm operator)."""


@dataclass
class SupervisorJournal:
    """Appends one JSON object per line to ``path`` (flushed each line), and keeps them."""

    path: Path
    clock: Callable[[], float] = time.time
    events: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, event: str, **fields: Any) -> None:
        row = {"event": event, "unix": round(self.clock(), 3), **fields}
        self.events.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")


@dataclass
class Supervisor:
    """One job's supervisor; :meth:`run` returns the final decision."""

    slurm: JobSlurm
    command: Sequence[str]
    processes: int
    batch_host: str
    journal: SupervisorJournal
    max_relaunches: int = DEFAULT_MAX_RELAUNCHES
    grace_s: float = DEFAULT_GRACE_S
    standby_after_s: float | None = DEFAULT_STANDBY_AFTER_S
    """Seconds into a launch before standbys are started for the next; None: never (every
    launch starts its processes then)."""
    signal_lead_s: float = 60.0
    """How long before the time limit Slurm warns the job with USR1 (``--signal``)."""
    progress: Path | None = None
    """The run's progress folder: a launch whose processes stop making progress there is
    ended and relaunched (:mod:`recovery.inalloc.hang`); None: not watched."""
    budgets: Budgets = field(default_factory=Budgets)
    """The stall thresholds of :mod:`recovery.progress.stall`."""
    stacks_wait_s: float = STACKS_WAIT_S
    slow_report_wait_s: float = SLOW_REPORT_WAIT_S
    steps: int | None = None
    """The training's final step (its ``--steps``), for what a swap of a slow node would
    save; None: unknown, and a slow node is only reported."""
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    """Unix seconds: the progress records' clock."""
    sleep: Callable[[float], None] = time.sleep
    signalled: int | None = None
    """A signal that asked the job to stop: after it the supervisor relaunches nothing."""
    vetting: Vetting | None = None
    """Checks of the job's spares (:mod:`recovery.inalloc.vetting`): a relaunch takes only
    spares that passed; None: spares are taken as they are."""
    _rejected: set[str] = field(default_factory=set)
    """Spares that failed their check: never taken (held out of service, or kept unused)."""
    _incoming: list[int] = field(default_factory=list)
    _leaving: tuple[str, ...] = ()
    _lost_at: float | None = None
    _lost_before: tuple[str, ...] = ()
    _hung_before: tuple[str, ...] = ()
    _relaunched_at: float | None = None
    """When the last relaunch was decided (Unix seconds): its cost ends at its first step."""
    _relaunch_cost_s: float | None = None

    def forward(self, signum: int) -> None:
        """A signal the batch script forwarded (USR1, TERM), noted here (this runs in the
        signal handler) and acted on by the loop within :data:`STEP_POLL_S`.

        USR1 is what the coordinator sends the jobs of a node it drains ("save and leave
        the node"), and what Slurm sends before the time limit. Here it is taken as the
        coordinator's when a node of the job is lost, or was within
        :data:`~recovery.inalloc.decide.RECENT_LOSS_S`, and the time limit is further than the
        warning's lead: for a node the step still trains on, the step saves and stops and is
        relaunched without it; for a node the job already left, it is ignored. Any other
        signal stops the step and the job (:mod:`recovery.inalloc.decide` holds the rules)."""
        self._incoming.append(signum)

    def run(self) -> StepDecision:
        marked = self._mark_supervised()
        try:
            return self._supervise()
        finally:
            if marked:
                unmark_supervised(marked)
            self.slurm.close()

    def _mark_supervised(self) -> Path | None:
        """Tell the node agents that this supervisor moves the job off a slow node itself (a
        job that asks for swaps is not moved on the requeue path too); the folder marked."""
        if self.progress is None:
            return None
        try:
            mark_supervised(self.progress, f"{socket.gethostname()} pid {os.getpid()}")
        except OSError as e:
            self.journal("unmarked", why=f"cannot mark {self.progress} as supervised: {e}")
            return None
        return self.progress

    def _supervise(self) -> StepDecision:
        job_nodes = self.slurm.job_nodes()
        layout = first_layout(job_nodes, self.batch_host, self.processes)
        self.journal(
            "supervising",
            pid=os.getpid(),
            job_nodes=job_nodes,
            step_nodes=list(layout.step),
            spares=list(layout.spares),
            batch_host=self.batch_host,
            max_relaunches=self.max_relaunches,
        )
        relaunches = 0
        while True:
            status, stall, swap = self._run_step(layout, relaunches)
            hung_before, self._hung_before = self._hung_before, ()
            decision: StepDecision
            if swap is not None and self.signalled is None:
                layout, relaunches = self._relaunching(layout, swap, relaunches)
                continue
            if stall is not None and self.signalled is None:
                culprits = [c.node for c in stall.culprits] if stall.confident else []
                self._hung_before = tuple(culprits)
                layout = self._vetted(layout, need=len(set(culprits) & set(hung_before)))
                decision = after_hang(
                    layout, culprits, hung_before=hung_before, relaunches=relaunches,
                    max_relaunches=self.max_relaunches,
                )  # fmt: skip
                if isinstance(decision, Relaunch):
                    layout, relaunches = self._relaunching(layout, decision, relaunches)
                    continue
                self._decided(decision)
                return decision
            if self._leaving and self.signalled is None:
                # Saved and stopped to leave a lost node: relaunched without it, as a failure.
                status = status_after_leaving(status)
            elif ended_cleanly(status) and self.signalled is None:
                status = self._check_success(layout, status)
            self._leaving = ()
            if self.signalled is not None:
                decision = after_signalled_step(
                    layout, status, signal.Signals(self.signalled).name,
                    relaunches=relaunches, max_relaunches=self.max_relaunches,
                )  # fmt: skip
            elif ended_cleanly(status):
                decision = after_step(
                    layout, status, lost=(), dropped=(), relaunches=relaunches,
                    max_relaunches=self.max_relaunches,
                )  # fmt: skip
            else:
                lost, dropped = self._wait_for_lost(layout)
                need = sum(1 for n in layout.step if n in lost)
                layout = self._vetted(layout, need=need, skip=lost)
                decision = after_step(
                    layout, status, lost=lost, dropped=dropped, relaunches=relaunches,
                    max_relaunches=self.max_relaunches,
                )  # fmt: skip
            if not isinstance(decision, Relaunch):
                self._decided(decision)
                return decision
            layout, relaunches = self._relaunching(layout, decision, relaunches)

    def _relaunching(
        self, layout: Layout, decision: Relaunch, relaunches: int
    ) -> tuple[Layout, int]:
        """Give back what ``decision`` releases; the next launch's layout and count."""
        self._relaunched_at = self.wall()
        if decision.release:
            self._release(decision.release)
        relaunches += 1
        layout = next_layout(layout, decision)
        extra = {"why": decision.why} if decision.why else {}
        self.journal(
            "relaunch",
            attempt=relaunches,
            lost=list(decision.lost),
            step_nodes=list(layout.step),
            spares=list(layout.spares),
            **extra,
        )
        return layout, relaunches

    def _release(self, nodes: Sequence[str]) -> None:
        """Give ``nodes`` back to Slurm. Slurm refuses to shrink a job while a DOWN node is
        still in it (it drops that one itself a moment later): a refusal is journaled and the
        relaunch goes on, since the step's node list leaves the lost nodes out anyway."""
        keep = [n for n in self.slurm.job_nodes() if n not in nodes]
        try:
            self.slurm.release(keep)
        except RecoverError as e:
            self.journal("release-refused", nodes=list(nodes), error=str(e))
            return
        self.journal("released", nodes=list(nodes), keep=keep)

    def _run_step(
        self, layout: Layout, attempt: int
    ) -> tuple[int, Verdict | None, Relaunch | None]:
        """Launch the training on ``layout`` and wait for it to end: its status; the verdict
        that ended it when it stopped making progress, or the relaunch without a slow node it
        was ended for (None otherwise)."""
        watch = None
        if self.progress is not None:
            watch = LaunchWatch(self.progress, len(layout.step), self.wall(), self.budgets)
        step = self.slurm.launch(layout.step, self.command)
        self.journal(
            "launched",
            attempt=attempt,
            nodes=list(layout.step),
            warm=list(step.warm),
            step_pid=step.pid,
        )
        if self.signalled is not None:  # a signal that came while the step was starting
            step.signal(self.signalled)
        standby_at = None if self.standby_after_s is None else self.clock() + self.standby_after_s
        look_at = self.clock() + LOOK_EVERY_S
        stall: Verdict | None = None
        swap: Relaunch | None = None
        slow_at: float | None = self.clock()  # when the straggler may be judged (None: done)
        slow_said = False
        while True:
            self._take_signals(layout, step)
            status = step.wait(STEP_POLL_S)
            if status is not None:
                break
            if standby_at is not None and self.clock() >= standby_at:
                standby_at = None
                nodes = self.slurm.job_nodes()
                started = self.slurm.warm(nodes, self.command)
                self.journal("standby", attempt=attempt, started=started, nodes=nodes)
                self._check_spares(layout)
            self._hold_failed()
            if watch is not None and stall is None and swap is None and self.clock() >= look_at:
                look_at = self.clock() + LOOK_EVERY_S
                stall = self._stalled(watch, attempt)
                self._note_relaunch_cost(watch, attempt)
                due = slow_at is not None and self.clock() >= slow_at
                if stall is None and watch.straggler is not None and due:
                    swap, again = self._swap_for(watch, layout, attempt, said=slow_said)
                    slow_said = True
                    slow_at = self.clock() + SLOW_REJUDGE_S if again else None
                if stall is not None or swap is not None:
                    step.end()
        self._take_signals(layout, None)  # one that came as the step ended
        self.journal("step-ended", attempt=attempt, status=status)
        return status, stall, swap

    def _note_relaunch_cost(self, watch: LaunchWatch, attempt: int) -> None:
        """A relaunch's cost, once its first step finished: from the decision to that step."""
        if attempt == 0 or self._relaunched_at is None or watch.first_step_at is None:
            return
        cost = max(0.0, watch.first_step_at - self._relaunched_at)
        self._relaunched_at = None
        self._relaunch_cost_s = cost
        self.journal("relaunch-cost", attempt=attempt, cost_s=round(cost, 3))

    def _swap_for(
        self, watch: LaunchWatch, layout: Layout, attempt: int, *, said: bool = False
    ) -> tuple[Relaunch | None, bool]:
        """The relaunch without the launch's straggler, when the job asked for swaps and it
        is worth it (:func:`~recovery.inalloc.decide.after_slow`), and whether to judge it
        again later (only a gain that does not pay yet may change). Journaled the first time
        (``said`` false) and when it swaps."""
        slow = watch.straggler
        assert slow is not None
        cost = self._relaunch_cost_s if self._relaunch_cost_s is not None else RELAUNCH_COST_S
        left = None if self.steps is None else self.steps - slow.step
        gain = 0.0 if left is None else swap_gain(slow.peers_s + slow.excess_s, slow.peers_s, left)
        if not watch.straggler_rule.swap:
            outcome: Relaunch | str = "the job asks for reports only (straggler.swap false)"
        elif left is None:
            outcome = "the training's final step is unknown"
        else:
            if gain > cost:  # a swap is likely: the spare it would take must pass its check
                layout = self._vetted(layout, need=1)
            outcome = after_slow(
                layout, slow.node, gain_s=gain, cost_s=cost, relaunches=attempt,
                max_relaunches=self.max_relaunches,
            )  # fmt: skip
        swapping = isinstance(outcome, Relaunch)
        again = not swapping and watch.straggler_rule.swap and left is not None and gain <= cost
        if said and not swapping:
            return None, again
        self.journal(
            "slow",
            attempt=attempt,
            node=slow.node,
            rank=slow.rank,
            step=slow.step,
            step_s=round(slow.step_s, 4),
            peers_s=round(slow.peers_s, 4),
            lost_s=round(slow.lost_s, 3),
            gain_s=round(gain, 3),
            cost_s=round(cost, 3),
            swap=isinstance(outcome, Relaunch),
            why=outcome.why if isinstance(outcome, Relaunch) else outcome,
        )
        if not isinstance(outcome, Relaunch):
            return None, again
        # The node's agent reports it (the incident) from the same records: give it a moment,
        # as for a hang's stacks; once the launch ends there is nothing left to report.
        deadline = self.clock() + self.slow_report_wait_s
        while not slow_reported(watch.directory, slow.rank, watch.launched_at):
            if self.clock() >= deadline:
                self.journal("slow-unreported", attempt=attempt, node=slow.node, rank=slow.rank)
                break
            self.sleep(POLL_S)
        return outcome, False

    def _stalled(self, watch: LaunchWatch, attempt: int) -> Verdict | None:
        """The verdict when the launch has stopped making progress (after waiting, up to
        :attr:`stacks_wait_s`, for the node agents to take its processes' stacks); None while
        it progresses, or once a signal asked the job to stop (that path ends it)."""
        now = self.wall()
        had = watch.error
        verdict = watch.look(now)
        if watch.error is not None and watch.error != had:
            self.journal("budgets-refused", attempt=attempt, error=watch.error)
        if not verdict.stalled or self.signalled is not None:
            return None
        self.journal(
            "stalled",
            attempt=attempt,
            why=verdict.why,
            idle_s=round(verdict.idle_s, 3),
            budget_s=round(verdict.budget_s, 3),
            step=verdict.step,
            confident=verdict.confident,
            culprits=[{"rank": c.rank, "node": c.node, "why": c.why} for c in verdict.culprits],
        )
        ranks = list(range(watch.processes))
        deadline = self.clock() + self.stacks_wait_s
        while (absent := missing(watch.directory, ranks, now)) and self.clock() < deadline:
            self.sleep(POLL_S)
        self.journal(
            "stacks", attempt=attempt, missing=absent, folder=str(watch.directory / "stacks")
        )
        return verdict

    def _take_signals(self, layout: Layout, step: Step | None) -> None:
        """Act on the signals :meth:`forward` noted (``step``: the running launch, if any)."""
        while self._incoming:
            signum = self._incoming.pop(0)
            name = signal.Signals(signum).name
            lost = self._leave_for(layout) if signum == signal.SIGUSR1 else None
            if lost is None:
                self.signalled = signum
                if step is not None:
                    step.signal(signum)
                continue
            in_step = leave_step(layout, lost)
            if not in_step:
                why = "save and leave for nodes the job no longer trains on"
                self.journal("signal-ignored", signal=name, lost=list(lost), why=why)
                continue
            self._leaving = in_step
            why = "save and leave: the step saves, then goes on without them"
            self.journal("signal-leave", signal=name, nodes=list(in_step), why=why)
            if step is not None:
                step.signal(signum)

    def _leave_for(self, layout: Layout) -> tuple[str, ...] | None:
        """The lost nodes a USR1 now is about (see :meth:`forward`); None: it is not about a
        node (the time limit's warning, or an operator's)."""
        try:
            left = self.slurm.time_left()
        except RecoverError as e:  # unknown: the lost node decides
            self.journal("time-left-unknown", error=str(e))
            left = None
        if time_limit_warning(left, self.signal_lead_s):
            return None
        lost, _ = self._lost_now(layout)
        since = None if self._lost_at is None else self.clock() - self._lost_at
        return usr1_about(lost, self.batch_host, since, self._lost_before)

    def _check_success(self, layout: Layout, status: int) -> int:
        """``status`` as :func:`~recovery.inalloc.decide.checked_status` takes it, given the
        step's nodes Slurm reports lost now (journaled when it is overruled)."""
        held = set(self.slurm.job_nodes())
        bad = self.slurm.bad_nodes([n for n in layout.step if n in held])
        lost, _ = lost_among(layout.step, held, bad)
        checked = checked_status(status, lost)
        if checked != status:
            why = "a node of the step is lost: srun's status is not the training's"
            self.journal("status-overruled", status=status, lost=lost, why=why)
        return checked

    def _wait_for_lost(self, layout: Layout) -> tuple[list[str], list[str]]:
        """The job's lost nodes and those Slurm already dropped, waiting up to ``grace_s`` for
        one of the step's nodes to be among them (the coordinator's verdict may trail the
        crash it caused by a moment)."""
        started = self.clock()
        while True:
            lost, dropped = self._lost_now(layout)
            waited = self.clock() - started
            if lost_wait_over(layout, lost, waited, self.grace_s):
                self.journal("lost", nodes=lost, dropped=dropped, waited_s=round(waited, 3))
                if lost:
                    self._lost_at, self._lost_before = self.clock(), tuple(lost)
                return lost, dropped
            self.sleep(POLL_S)

    def _lost_now(self, layout: Layout) -> tuple[list[str], list[str]]:
        """Of the layout's nodes, those lost (dropped from the job, or DOWN, DRAIN, FAIL, not
        responding), and those of them Slurm already dropped; the batch host among them
        (it is in the job while it lives; a DRAIN on it is a loss like any other)."""
        watched = list(layout.step) + [n for n in layout.spares if n not in self._rejected]
        held = set(self.slurm.job_nodes())
        bad = self.slurm.bad_nodes([n for n in watched if n in held])
        return lost_among(watched, held, bad)

    # --- the spares' checks -------------------------------------------------------------

    def _check_spares(self, layout: Layout) -> None:
        """Start the background checks of the spares that are due."""
        if self.vetting is None:
            return
        todo = self.vetting.start(n for n in layout.spares if n not in self._rejected)
        if todo:
            self.journal("spare-checking", nodes=todo, background=True)

    def _hold_failed(self) -> None:
        """Hold out each spare the background checks failed (once)."""
        if self.vetting is None:
            return
        for check in self.vetting.failed():
            if check.node not in self._rejected:
                self._reject(check)

    def _vetted(self, layout: Layout, *, need: int, skip: Sequence[str] = ()) -> Layout:
        """``layout`` with only spares a relaunch may take: the first ``need`` of them (not
        in ``skip``: lost ones, the decision drops those itself) checked, waiting for a
        check running in the background or making one now; those that fail held out and
        left out, and the next ones checked in their place."""
        if self.vetting is None:
            return layout
        keep: list[str] = []
        passed = 0
        for node in layout.spares:
            if node in self._rejected:
                continue
            if node in skip or passed >= need:
                keep.append(node)
                continue
            if self.vetting.due(node):
                self.journal("spare-checking", nodes=[node], background=False)
            check = self.vetting.verdict(node)
            if check.passed:
                keep.append(node)
                passed += 1
            else:
                self._reject(check)
        return Layout(layout.step, tuple(keep), layout.batch_host)

    def _reject(self, check: NodeCheck) -> None:
        """A spare that failed its check: drained with the failed check as its reason and
        given back (out of service, as the coordinator holds a pool spare that fails); the
        batch host, or a node Slurm will not let the job's user drain, is kept, unused."""
        node = check.node
        self._rejected.add(node)
        reason = check.hold_reason()
        if node == self.batch_host:
            self.journal("spare-rejected", node=node, reason=reason, held=False,
                         why="it runs the batch script: kept in the job, unused")  # fmt: skip
            return
        try:
            self.slurm.hold(node, reason)
        except RecoverError as e:
            self.journal("spare-rejected", node=node, reason=reason, held=False,
                         why=f"Slurm refused the drain ({e}): kept in the job, unused")  # fmt: skip
            return
        self.journal("spare-rejected", node=node, reason=reason, held=True)
        self._release([node])

    def _decided(self, decision: StepDecision) -> None:
        if isinstance(decision, Finish):
            self.journal("finish", status=decision.status, why=decision.why)
        elif isinstance(decision, Requeue):
            self.journal("requeue", lost=list(decision.lost), why=decision.why)


def install_forwarding(supervisor: Supervisor) -> None:
    """Forward USR1 and TERM (sent by the batch script) to the supervisor's step."""
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(signum, lambda s, _frame: supervisor.forward(s))
