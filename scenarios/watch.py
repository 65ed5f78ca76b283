"""Watching a scenario run: the job's ``events.jsonl``, its supervisor's journal (an
in-allocation job's ``supervisor-<job>.jsonl``), the coordinator's incidents and the job's
Slurm state, polled; every new thing becomes one progress line as it happens.

Each source is polled at its own pace (the events file on every poll: it is a local read;
incidents every 0.5 s, Slurm every second: each is a request or a subprocess on a machine the
training shares). A coordinator that does not answer (killed by the scenario) is skipped until
it is back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery import proc
from recovery.errors import RecoverError, TransientError
from recovery.ports.journal import PhaseName
from recovery.ports.slurm import JobInfo, SlurmControl
from service.httpapi.client import Client

Say = Callable[[str], None]
#: Journal phases that mean the coordinator has acted on Slurm for an incident.
ACTED = frozenset(
    {PhaseName.node_down, PhaseName.node_drained, PhaseName.jobs_requeued, PhaseName.jobs_signalled}
)


@dataclass
class Watcher:
    """The run as last seen. Call :meth:`poll` often; read the fields and helpers between."""

    run_dir: Path
    job_id: str
    slurm: SlurmControl
    client: Client
    say: Say
    incidents_every_s: float = 0.5
    job_every_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    events: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    job: JobInfo | None = None
    job_was_running: bool = False
    first_nodes: tuple[str, ...] = ()
    """The nodes of the job's first allocation."""
    first_step_seen: float | None = None
    """When (``clock``) the first training step was read; ``after_s`` of a first entry
    counts from here."""
    supervisor: list[dict[str, Any]] = field(default_factory=list)
    """The supervisor's journal so far (an in-allocation job's; [] for the others)."""
    _events: _Lines | None = None
    _journal: _Lines | None = None
    _shown: set[tuple[str, str]] = field(default_factory=set)
    _next_incidents: float = 0.0
    _next_job: float = 0.0
    _job_line: str = ""

    # --- polling ------------------------------------------------------------------------

    def poll(self, *, force: bool = False) -> None:
        """Read what is new from each source that is due (every source when ``force``)."""
        now = self.clock()
        self._read_events()
        if force or now >= self._next_incidents:
            self._next_incidents = now + self.incidents_every_s
            self._read_incidents()
        if force or now >= self._next_job:
            self._next_job = now + self.job_every_s
            self._read_job()

    def poll_events(self) -> None:
        """Read only what is new in the job's events file (a local read: cheap)."""
        self._read_events()

    def _read_events(self) -> None:
        if self._events is None:
            self._events = _Lines(self.run_dir / "events.jsonl")
            # The batch script runs in the run directory's parent (``--chdir``).
            journal = self.run_dir.parent / f"supervisor-{self.job_id}.jsonl"
            self._journal = _Lines(journal)
        for event in self._events.read():
            self.events.append(event)
            if event.get("event") == "step" and self.first_step_seen is None:
                self.first_step_seen = self.clock()
            self._show_event(event)
        assert self._journal is not None
        for entry in self._journal.read():
            self.supervisor.append(entry)
            self._show_supervisor(entry)

    def _read_incidents(self) -> None:
        try:
            found = self.client.get("/v1/incidents")
        except TransientError:
            return  # the coordinator is down (a scenario may kill it): try again later
        self.incidents = sorted(found, key=lambda i: i["opened"]["wall"])
        for inc in self.incidents:
            self._show_incident(inc)

    def _read_job(self) -> None:
        try:
            job = self.slurm.job(self.job_id)
        except RecoverError:
            return
        self.job = job
        if job.state == "RUNNING":
            self.job_was_running = True
            self.first_nodes = self.first_nodes or job.nodes
        line = f"job {job.job_id}: {job.state}"
        if job.state == "RUNNING":
            line += f" on {','.join(job.nodes)}"
        elif job.reason and job.reason != "None":
            line += f" ({job.reason})"
        if job.restart_count:
            line += f", restart {job.restart_count}"
        if line != self._job_line:
            self._job_line = line
            self.say(line)

    # --- progress lines -----------------------------------------------------------------

    def _show_event(self, e: dict[str, Any]) -> None:
        kind = e.get("event")
        where = f" on {e['node']}" if e.get("node") else ""
        if kind == "started":
            self.say(f"training started{where} (run {e.get('restart_count', 0)})")
        elif kind == "restored":
            fb = e.get("fallbacks", 0)
            self.say(f"training restored step {e.get('step')}{where}"
                     + (f" after {fb} fallback(s)" if fb else ""))  # fmt: skip
        elif kind == "fallback":
            self.say(f"training: checkpoint step {e.get('step')} failed verification "
                     f"({e.get('reason')}); falling back")  # fmt: skip
        elif kind == "checkpoint":
            self.say(f"training: checkpoint step {e.get('step')} durable")
        elif kind == "preempted":
            self.say(f"training saved step {e.get('step')} and stopped on {e.get('signal')}")
        elif kind == "completed":
            self.say(f"training completed step {e.get('step')}, digest "
                     f"{str(e.get('state_digest'))[:16]}")  # fmt: skip

    def _show_supervisor(self, e: dict[str, Any]) -> None:
        """The supervisor's decisions (what it launched on, what it judged and why): what a
        failed in-allocation run is read by."""
        kind = e.get("event")
        if kind == "relaunch":
            why = f": {e['why']}" if e.get("why") else ""
            lost = f" without {','.join(e['lost'])}" if e.get("lost") else ""
            self.say(f"supervisor: relaunch {e.get('attempt')} on "
                     f"{','.join(e.get('step_nodes', []))}{lost}{why}")  # fmt: skip
        elif kind == "step-ended" and e.get("status") != 0:
            self.say(f"supervisor: launch {e.get('attempt')} ended with status {e.get('status')}")
        elif kind == "lost":
            self.say(f"supervisor: lost {','.join(e.get('nodes', []))}")
        elif kind == "stalled":
            self.say(f"supervisor: launch {e.get('attempt')} stalled: {e.get('why')}")
        elif kind == "slow" and e.get("swap"):
            self.say(f"supervisor: moving off the slow {e.get('node')}: {e.get('why')}")
        elif kind == "spare-rejected":
            self.say(f"supervisor: spare {e.get('node')} rejected: {e.get('reason')}")
        elif kind in ("requeue", "finish"):
            self.say(f"supervisor: {kind}: {e.get('why')}")

    def _show_incident(self, inc: dict[str, Any]) -> None:
        key = (inc["id"], "")
        if key not in self._shown:
            self._shown.add(key)
            self.say(f"incident {inc['id']} on {inc['node']}: {inc['fault']} -> {inc['verdict']}")
        for p in sorted(inc.get("phases", []), key=lambda p: p["at"]["wall"]):
            key = (inc["id"], p["name"])
            if key in self._shown:
                continue
            self._shown.add(key)
            detail = f" ({p['detail']})" if p.get("detail") else ""
            self.say(f"  {inc['id']} {p['name']}{detail}")

    # --- what the triggers ask ----------------------------------------------------------

    def max_step(self) -> int:
        """The highest step the training finished so far (0 before any)."""
        return max((int(e["step"]) for e in self.events if e.get("event") == "step"), default=0)

    def newest_checkpoint(self) -> int:
        """The newest durable checkpoint's step (0 before any)."""
        steps = (int(e["step"]) for e in self.events if e.get("event") == "checkpoint")
        return max(steps, default=0)

    def count(self, event: str) -> int:
        """How many events of this kind were written so far."""
        return sum(1 for e in self.events if e.get("event") == event)

    def first(self, event: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == event), None)

    def last(self, event: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e.get("event") == event), None)

    def training_pid(self) -> int | None:
        """The pid of the live training process (the holder of the run lock), else None."""
        try:
            text = (self.run_dir / "checkpoints" / ".lock").read_text().strip()
        except OSError:
            return None
        pid = int(text) if text.isdigit() else 0
        return pid if pid > 0 and proc.alive(pid) else None

    def training_pid_on(self, node: str) -> int | None:
        """The pid of the live training process on ``node`` (any rank's), else None: the
        newest process whose event log says it runs there (every event carries its pid and
        node; process 0 writes ``events.jsonl``, rank r ``events.rank<r>.jsonl``)."""
        candidates: list[tuple[float, int]] = []
        for path in [self.run_dir / "events.jsonl", *self.run_dir.glob("events.rank*.jsonl")]:
            for e in _tail_events(path):
                pid = e.get("pid")
                if e.get("node") == node and isinstance(pid, int):
                    candidates.append((float(e.get("ts", 0.0)), pid))
        for _, pid in sorted(candidates, reverse=True):
            if proc.alive(pid):
                return pid
        return None

    def running_nodes(self) -> tuple[str, ...]:
        """The job's nodes while it runs (the batch step's node first), else ()."""
        self._read_job()
        if self.job is None or self.job.state != "RUNNING":
            return ()
        return self.job.nodes

    def requeued(self) -> bool:
        """The job ran, was requeued, and its next run's training has not started: no
        training process lives, and the job is back in the queue or, given nodes again
        already (Slurm 25.11's expedited requeue starts it within a second), at a restart
        count no training run has started at yet."""
        job = self.job
        if job is None or not self.job_was_running or job.finished:
            return False
        if self.training_pid() is not None:
            return False
        if job.state == "PENDING":
            return True
        started = [
            int(e.get("restart_count", 0)) for e in self.events if e.get("event") == "started"
        ]
        return job.restart_count > max(started, default=0)


@dataclass
class _Lines:
    """A JSON-lines file read as it grows: each :meth:`read` returns the records written
    since the last (none while the file is absent; a line cut by a kill is skipped)."""

    path: Path
    _offset: int = 0
    _partial: bytes = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a line cut by a SIGKILL; the next run's lines follow it
            if isinstance(doc, dict):
                out.append(doc)
        return out


def _tail_events(path: Path, size: int = 65536) -> list[dict[str, Any]]:
    """The parseable event lines in the last ``size`` bytes of ``path`` ([] when absent)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - size))
            chunk = f.read()
    except OSError:
        return []
    out = []
    for line in chunk.split(b"\n"):
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # the first, cut line of the window, or one cut by a kill
        if isinstance(doc, dict):
            out.append(doc)
    return out
