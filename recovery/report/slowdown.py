"""What a slow node cost the job: the time lost to it before the swap, the swap itself, and
after. Pure: the job's steps and the slow-node incidents in, seconds out.

Every step of a job waits for its slowest process, so a straggler shows in every process's
step times alike; process 0's are used. The healthy step time (``baseline``) is the median
time per step of the updates before the slowdown began (the first two of each process left
out: they compile), or, when there were too few, of the updates after the swap. Then:

* ``lost_before``: the updates from the slowdown's start until the job was stopped for the
  swap (or until the end, when it was left in), each counted for what it took beyond the
  baseline;
* ``swap``: from the last update of the slow launch to the first update past the step it had
  reached, less one baseline step: the relaunch and any step done again;
* ``lost_after``: the updates after the swap beyond the baseline (near 0 when the slow node
  is gone; the whole slowdown again when the relaunch kept it).

The slowdown begins at the injection the scenario recorded on that node (``run.json``),
else at the agent's observation.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from recovery.report.phases import match_fault
from recovery.report.processes import Process, Step
from recovery.report.restarts import high_water
from recovery.report.run import Incident, RunRecord

#: The faults that mean "this node is slow" (the agents' and NVML's).
SLOW_FAULTS = frozenset({"node-slow", "node-slow-swap", "gpu-slowdown"})
#: Updates a process does first that include compilation: never part of a step time.
WARM_STEPS = 2
#: Healthy updates needed for a baseline.
MIN_BASELINE_STEPS = 3


@dataclass(frozen=True)
class Slowdown:
    """One slow node and what it cost the job."""

    incident: str
    node: str
    began: float
    """When the slowdown began (wall seconds)."""
    began_source: str
    noticed: float | None
    """When the coordinator recorded it (its decision)."""
    swap: str
    """What was done: ``swapped`` (the job relaunched without the node), ``restarted`` (the
    job ran again, the report cannot tell on which nodes), ``left in``."""
    swap_detail: str
    """The supervisor's reason for its choice, when it journaled one."""
    stopped: float | None
    """When the slow launch made its last update (None: left in)."""
    baseline_step_s: float | None
    slow_step_s: float | None
    """Median seconds per update while the node was in."""
    steps_slow: int
    lost_before_s: float | None
    swap_s: float | None
    lost_after_s: float | None
    why: str = ""
    """Why the costs are unknown, when they are."""

    @property
    def factor(self) -> float | None:
        if not self.baseline_step_s or self.slow_step_s is None:
            return None
        return self.slow_step_s / self.baseline_step_s

    @property
    def total_s(self) -> float | None:
        """Everything the slow node cost: before, swap and after."""
        parts = (self.lost_before_s, self.swap_s, self.lost_after_s)
        known = [p for p in parts if p is not None]
        return sum(known) if known else None


def _durations(p: Process) -> list[tuple[Step, float]]:
    """Each update of ``p`` after its warm-up ones, with the time since the update before."""
    return [
        (s, s.ts - prev.ts)
        for i, (prev, s) in enumerate(zip(p.steps, p.steps[1:], strict=False), start=1)
        if i >= WARM_STEPS
    ]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _began(incident: Incident, run: RunRecord) -> tuple[float, str]:
    injected = match_fault(incident, run.faults)
    if injected is not None:
        return injected.at, f"{injected.fault} injected via {injected.via}, per run.json"
    first = incident.phases[0].at if incident.phases else incident.opened
    return first, "observed by the agent (no injection in run.json)"


def _supervisor_word(run: RunRecord, node: str, after: float) -> tuple[str, str]:
    """The supervisor's choice for ``node`` (``swapped`` or ``left in``) and its reason; empty
    when it journaled none."""
    judged = [
        e
        for e in run.supervisor
        if e.event == "slow" and e.at >= after and e.data.get("node") == node
    ]
    # Judged again while the swap did not pay: the swap, when one came, is what was done.
    slow = next((e for e in judged if e.data.get("swap")), judged[0] if judged else None)
    if slow is None:
        return "", ""
    return ("swapped" if slow.data.get("swap") else "left in"), str(slow.data.get("why", ""))


def slowdown(incident: Incident, run: RunRecord, processes: Sequence[Process]) -> Slowdown:
    """The cost of the slow node of ``incident`` (one of :data:`SLOW_FAULTS`) to the job that
    ran as ``processes`` (process 0's runs)."""
    began, source = _began(incident, run)
    decided = next((p.at for p in incident.phases if p.name == "decided"), None)
    live = [p for p in processes if p.started <= began]
    word, detail = _supervisor_word(run, incident.node, began)
    # Moved on the requeue path: the agent's node-slow-swap, alone or joining the node's
    # node-slow incident (which it raises to drain-reset).
    moved = incident.fault == "node-slow-swap" or incident.verdict in ("drain-reset", "replace")
    if not word and moved:
        word = "swapped"
        detail = (
            f"the agent asked for the move (node-slow-swap); {incident.node} drained, the job "
            "saved and requeued onto a spare"
        )

    def unknown(why: str) -> Slowdown:
        return Slowdown(
            incident.id, incident.node, began, source, decided, word or "left in", detail,
            None, None, None, 0, None, None, None, why,
        )  # fmt: skip

    if not live:
        return unknown("no process of the job was running when the slowdown began")
    slow_proc = live[-1]
    successor = next((p for p in processes if p.index > slow_proc.index), None)
    healthy = [
        d for p in processes[: slow_proc.index + 1] for s, d in _durations(p) if s.ts <= began
    ]
    after = _durations(successor) if successor is not None else []
    baseline = _median(healthy) if len(healthy) >= MIN_BASELINE_STEPS else None
    if baseline is None and len(after) >= MIN_BASELINE_STEPS and word == "swapped":
        baseline = _median([d for _, d in after])
    slow = [(s, d) for s, d in _durations(slow_proc) if s.ts > began]
    if baseline is None:
        return unknown(
            f"fewer than {MIN_BASELINE_STEPS} healthy updates to measure a step by (the first "
            f"{WARM_STEPS} of each process compile)"
        )
    lost_before = sum(max(0.0, d - baseline) for _, d in slow)
    if successor is None:
        return Slowdown(
            incident.id, incident.node, began, source, decided, "left in", detail, None,
            baseline, _median([d for _, d in slow]), len(slow), lost_before, None, None,
        )  # fmt: skip
    high, last_before = high_water(processes, successor.index)
    beyond = successor.first_beyond(high or 0)
    swap_s = (
        max(0.0, beyond.ts - last_before - baseline)
        if beyond is not None and last_before is not None
        else None
    )
    lost_after = sum(max(0.0, d - baseline) for s, d in after if beyond is None or s.ts > beyond.ts)
    return Slowdown(
        incident.id, incident.node, began, source, decided, word or "restarted", detail,
        slow_proc.end, baseline, _median([d for _, d in slow]), len(slow), lost_before,
        swap_s, lost_after,
    )  # fmt: skip


def slowdowns(run: RunRecord, processes: Sequence[Process]) -> tuple[Slowdown, ...]:
    """Every slow node of the run, one per incident of :data:`SLOW_FAULTS` (the first of a
    node's companions: ``node-slow`` and ``gpu-slowdown`` report the same slowness)."""
    out: list[Slowdown] = []
    seen: set[str] = set()
    for inc in sorted(run.incidents, key=lambda i: i.opened):
        if inc.fault in SLOW_FAULTS and inc.node not in seen:
            seen.add(inc.node)
            out.append(slowdown(inc, run, processes))
    return tuple(out)
