"""Running a scenario: bring the cluster up (or attach to one), submit the training job, carry
out each entry when its trigger fires, wait for the job and the incidents to end, write the run
directory, have the report written, check the expectations, bring the cluster down.

Progress goes to ``say`` one line per thing as it happens (training events, incident phases,
job state changes, what the runner did), each stamped with the seconds since the start. Every
wait is on a condition, bounded by a :class:`Deadline`: the scenario's ``timeout_s`` counted
from the job's first step, and :data:`START_UP_S` for everything before it (the cluster, the
agents, the job's start-up and compile, all of which a loaded machine stretches); a run that
times out still writes its directory, with the reason in ``notes`` and as a failed check.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from recovery.errors import RecoverError, UsageError
from recovery.pool.spares import is_spare
from recovery.ports.journal import PhaseName
from scenarios import command_job, rundir
from scenarios.actions import carry_out, crash_first, release_throttles
from scenarios.control import Background
from scenarios.digests import compile_cache
from scenarios.expect import Check, OperatorAnswer, Outcome, check, progress
from scenarios.loader import Loaded, dotted, semantic_problems
from scenarios.reporting import ReportSummary, write_report
from scenarios.rig import Rig, attach, bring_up, cluster_root
from scenarios.schema import PER_NODE, ClusterSpec, ExistingCluster, Scenario, When
from scenarios.watch import ACTED, Watcher
from service.wiring import SlurmAccess
from slurm.sbatch import submit_training

Say = Callable[[str], None]
#: How long the runner waits, after the job ended, for the coordinator to close incidents.
SETTLE_S = 20.0
#: Seconds a job that ended other than COMPLETED must stay ended (incidents all closed)
#: before the runner takes it as the end: the coordinator requeues a job a fault ended.
ENDED_SETTLE_S = 15.0
#: Seconds between full polls while a step trigger reads only the events file.
LIGHT_FULL_S = 3.0
#: The coordinator's token for the job's supervisor (its spares' checks), in the run
#: directory while the job runs.
TOKENS_NAME = "coordinator.tokens"
#: Exit status of ``recover scenario run`` when the scenario ran but an expectation failed.
EXPECTATION_FAILED = 10
#: Seconds from the run's start (cluster bring-up included) to the job's first step before
#: the run times out. Seen on a CI machine running four scenarios on two cores: 111 s.
START_UP_S = 300.0


class ScenarioTimeout(RecoverError):
    """A condition the scenario waits on did not come true in time (the message says which)."""


@dataclass(frozen=True)
class Deadline:
    """When a run times out (monotonic seconds). Before the job's first step: ``started`` +
    the larger of :data:`START_UP_S` and ``run_s`` (a job that never trains still has its
    scenario's time); from the first step on: that step + ``run_s``, never earlier than
    before. Start-up is bounded apart because its length is the machine's, not the
    scenario's: the same cluster and job take 25 s to their first step on a quiet machine
    and 110 s on a loaded one."""

    started: float
    run_s: float

    def at(self, first_step: float | None) -> float:
        before = self.started + max(START_UP_S, self.run_s)
        return before if first_step is None else max(before, first_step + self.run_s)


@dataclass(frozen=True)
class RunOptions:
    """How to run: where to write, where the control runs are cached, and what to print."""

    out: Path
    cache: Path
    say: Say = print
    enforce_budgets: bool = True
    """False: phase budgets are reported, not failed (tests: no timed assertions)."""
    existing: ExistingCluster | None = None
    """Run on this existing cluster whatever the file says."""
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    slurm: SlurmAccess = field(default_factory=SlurmAccess)
    """How the runner reaches Slurm (``--slurm-backend``; unset fields from ``env``)."""


@dataclass
class RunResult:
    """What ``recover scenario run`` reports."""

    scenario: str
    out: Path
    checks: list[Check]
    report: ReportSummary | None
    elapsed_s: float
    cluster_root: Path | None = None
    """Where the local cluster ran (its processes carry this path); None: an existing one."""

    @property
    def passed(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "passed": self.passed,
            "out": str(self.out),
            "elapsed_s": round(self.elapsed_s, 1),
            "checks": [c.to_json() for c in self.checks],
            "timeline": str(self.report.timeline) if self.report and self.report.timeline else None,
            "cluster_root": str(self.cluster_root) if self.cluster_root else None,
        }


def run(loaded: Loaded, opts: RunOptions) -> RunResult:
    """Run ``loaded``'s scenario; see the module docstring. Never raises for a failed
    expectation (it is in the result); raises for what prevents the run from starting (Slurm
    missing, cluster not starting, a bad existing cluster) after stopping what it started."""
    s = loaded.scenario
    t0 = time.time()
    deadline = Deadline(time.monotonic(), s.timeout_s)

    def say(msg: str) -> None:
        opts.say(f"[{time.time() - t0:6.1f}s] {msg}")

    existing = opts.existing or s.cluster.existing
    if opts.existing is not None:
        _check_existing(s, opts.existing)
    out = opts.out.absolute()
    if out.exists() and any(out.iterdir()):
        # A journal, a cluster state and checkpoints from an earlier run would all be reused.
        raise UsageError(f"{out} exists and is not empty; choose another --out or remove it")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.yaml").write_text(loaded.text)
    j = s.job
    model = j.model if j.command is None else "command"
    rec = rundir.RunRecord(s.name, t0, j.steps, j.save_every, model, out / "job")
    say(f"scenario {s.name}: {s.description}")
    control = None
    if existing is None and s.expectations().digest_matches_control:
        # Started before the cluster, so the control trains while the daemons come up.
        control = Background(j, opts.cache, processes=_processes(s, s.cluster.nodes), env=opts.env)
    if existing is not None:
        rig, root = attach(existing, opts.env, say, opts.slurm), None
        if s.expectations().digest_matches_control:
            control = Background(
                j, opts.cache, processes=_processes(s, len(rig.nodes)), env=opts.env
            )
    else:
        root = cluster_root(out, s.cluster)
        rig = bring_up(s.cluster, root, say, opts.slurm, opts.env)
    rec.nodes, rec.spares = list(rig.nodes), list(rig.spares)
    try:
        seen = _observe(s, rig, rec, opts.cache, deadline, say)
    finally:
        _stop(rig, root, out, rec, say)
        (out / TOKENS_NAME).unlink(missing_ok=True)  # the job no longer needs it
    result = _conclude(s, out, rec, seen, control, opts.enforce_budgets, t0)
    result.cluster_root = root
    return result


def _stop(rig: Rig, root: Path | None, out: Path, rec: rundir.RunRecord, say: Say) -> None:
    """Stop what the runner started; bring a cluster that ran elsewhere into ``out``."""
    stopped = rig.down()
    if stopped:
        say(f"stopped {len(stopped)} process(es) of the local cluster")
    for problem in release_throttles():
        say(f"a CPU throttle was left: {problem}")
    if root is not None and root != out / "cluster":
        shutil.move(root, out / "cluster")
        rec.notes.append(f"the local cluster ran in {root} (the run directory is too deep for "
                         "slurmstepd's sockets); its state and logs are in cluster/")  # fmt: skip


@dataclass
class _Observed:
    """What the run did, read before the cluster goes down."""

    watch: Watcher
    answers: list[OperatorAnswer]
    incidents: list[dict[str, Any]]
    node_states: dict[str, str]
    job_state: str
    error: str | None


def _observe(
    s: Scenario, rig: Rig, rec: rundir.RunRecord, cache: Path, deadline: Deadline, say: Say
) -> _Observed:
    """Submit the job, carry out the entries, wait for the end; then read the incidents and
    the nodes the expectations name, and cancel the job if it still runs."""
    watch = _submit(s, rig, rec, cache, say)
    answers: list[OperatorAnswer] = []
    error: str | None = None
    try:
        answers = _drive(s, rig, watch, rec, deadline, say)
    except RecoverError as e:
        error = str(e)
        rec.notes.append(f"stopped early: {error}")
        say(f"stopped: {error}")
    incidents = _incidents(rig, watch, rec)
    expect = s.expectations()
    named = [*(expect.out_of_service or []), *(expect.in_service or [])]
    job_state = watch.job.state if watch.job else "unknown"
    if watch.job is not None and not watch.job.finished:
        rig.slurm.cancel(watch.job.job_id)
        rec.notes.append(f"job {watch.job.job_id} cancelled at the end ({job_state})")
    return _Observed(watch, answers, incidents, _node_states(rig, named), job_state, error)


def _conclude(
    s: Scenario,
    out: Path,
    rec: rundir.RunRecord,
    seen: _Observed,
    control: Background | None,
    enforce_budgets: bool,
    t0: float,
) -> RunResult:
    """Write the run directory, have the report written, check the expectations."""
    completed = seen.watch.last("completed")
    rec.final_digest = str(completed["state_digest"]) if completed else None
    if control is not None:
        try:
            rec.control_digest = control.result()
        except RecoverError as e:
            rec.notes.append(f"control run: {e}")
    rec.finished = time.time()
    rec.job_nodes = list(seen.watch.first_nodes)
    rundir.write(out, rec, seen.incidents)
    report, report_error = _report(out, rec, seen.incidents)
    outcome = Outcome(
        job_state=seen.job_state,
        final_digest=rec.final_digest,
        control_digest=rec.control_digest,
        progress=progress(seen.watch.events),
        requeues=seen.watch.job.restart_count if seen.watch.job else None,
        incidents=seen.incidents,
        node_states=seen.node_states,
        operator=seen.answers,
        report=report,
        report_error=report_error,
        error=seen.error,
    )
    checks = check(s.expectations(), outcome, enforce_budgets=enforce_budgets)
    result = RunResult(s.name, out, checks, report, time.time() - t0)
    rundir.write_result(out, result.to_json())
    return result


def _check_existing(s: Scenario, existing: ExistingCluster) -> None:
    """Refuse, before anything starts, a scenario that needs the local cluster."""
    moved = s.model_copy(update={"cluster": ClusterSpec(existing=existing)})
    problems = [f"{dotted(loc)}: {m}" for loc, m in semantic_problems(moved)]
    if problems:
        raise UsageError(
            f"scenario {s.name} cannot run on an existing cluster: " + "; ".join(problems)
        )


def _job_nodes(s: Scenario, in_service: int) -> int:
    """Nodes the job trains on, on a cluster with ``in_service`` nodes (in-allocation it asks
    for its spares besides)."""
    return in_service - s.job.job_spares if s.job.nodes == "all" else int(s.job.nodes)


def _processes(s: Scenario, in_service: int) -> int:
    """Training processes of the job (one per node) on a cluster of ``in_service`` nodes.

    Raises UsageError when they are more than the job's nodes (an existing cluster smaller
    than the file assumed), naming what fits."""
    nodes = _job_nodes(s, in_service)
    count = s.job.process_count(nodes)
    if count > nodes:
        raise UsageError(f"job.processes {count}: one process runs per node and the job has "
                         f"{nodes} node(s); ask for at most {nodes}")  # fmt: skip
    if s.job.command is None:
        from recovery.train.model import MODELS

        batch = MODELS[s.job.model].batch_size
        if s.job.processes == PER_NODE:
            # An existing cluster's node count is known only now: per-node takes the most
            # processes (one per node) that the model's batch divides over.
            while batch % count:
                count -= 1
        elif batch % count:
            raise UsageError(f"job.processes {count}: {s.job.model}'s batch of {batch} does "
                             f"not divide over {count} processes")  # fmt: skip
    return count


def _submit(s: Scenario, rig: Rig, rec: rundir.RunRecord, cache: Path, say: Say) -> Watcher:
    count = _job_nodes(s, len(rig.nodes))
    processes = _processes(s, len(rig.nodes))
    command = [
        sys.executable, "-m", "recover", "train", "--run-dir", str(rec.run_dir),
        *s.training_args(), "--step-sleep", str(s.job.step_sleep),
        "--compile-cache", str(compile_cache(cache)),
    ]  # fmt: skip
    if s.job.command is not None:
        command = command_job.job_command(s.job, rec.run_dir, cache)
    out = rec.run_dir.parent
    spares = s.job.job_spares
    # The coordinator, for the job's supervisor to ask about its spares (read-only).
    tokens = out / TOKENS_NAME
    tokens.write_text(f"admin {rig.client.token}\n")
    tokens.chmod(0o600)
    export = f"--export=ALL,RECOVER_COORDINATOR={rig.client.url},RECOVER_TOKEN_FILE={tokens}"
    job_id = submit_training(
        rig.slurm,
        command,
        sbatch_args=[f"--nodes={count}", f"--output={out}/job-%j.out", f"--chdir={out}", export],
        processes=processes,
        spares=spares,
    )
    rec.job_id = job_id
    rec.processes = processes
    what = s.job.model if s.job.command is None else "command " + " ".join(s.job.command)
    held = f" + {spares} spare(s) in the job (in-allocation)" if spares else ""
    say(f"job {job_id} submitted: {count} node(s){held}, {processes} process(es), {what} "
        f"to step {s.job.steps}, checkpoint every {s.job.save_every}")  # fmt: skip
    return Watcher(rec.run_dir, job_id, rig.slurm, rig.client, say)


@dataclass(frozen=True)
class _Mark:
    """The run as it stood when the previous entry was done: triggers count from here."""

    at: float | None
    """Monotonic seconds; None before the first step (``after_s`` waits for it)."""
    incidents: int
    """Incidents known just before the previous entry was carried out."""
    at_fault: int
    """Incidents known just before the latest fault was injected (``incidents: closed``
    waits for one opened after it)."""
    started: int


def _drive(
    s: Scenario, rig: Rig, watch: Watcher, rec: rundir.RunRecord, deadline: Deadline, say: Say
) -> list[OperatorAnswer]:
    answers: list[OperatorAnswer] = []
    mark = _Mark(None, 0, 0, 0)
    fault_node: str | None = None
    for i, entry in enumerate(s.faults, 1):
        when, since = entry.when, mark
        what = f"entry {i} ({entry.label}) to trigger: {when.describe()}"
        fatal_end = when.trigger[0] in ("step", "checkpoint", "job")
        # A step or checkpoint trigger reads only the events file between the slower polls
        # (a Slurm query, a request): on a loaded machine those take seconds, and a fault
        # meant for step N would land steps later.
        light = when.trigger[0] in ("step", "checkpoint")
        _wait(watch, deadline, what, partial(_fired, when, watch, since), fatal_end=fatal_end,
              light=light)  # fmt: skip
        if when.delay_s:
            until = time.monotonic() + when.delay_s
            _wait(watch, deadline, f"{when.delay_s:g} s more", partial(_past, until))
        # A fault that kills the training kills it the moment the trigger fired (the
        # bookkeeping below takes seconds on a loaded machine; the job may be done by then).
        crash = crash_first(entry, rig, watch, fault_node, say)
        # Counted before acting: an incident may open within milliseconds of the fault. After
        # a kill the fault's report follows at once, as on real hardware, so the count is the
        # last poll's (at most LIGHT_FULL_S old): a fresh poll takes seconds under load.
        if crash is None:
            watch.poll(force=True)
        before = len(watch.incidents)
        done = carry_out(entry, rig, watch, fault_node, say, crash)
        rec.faults += done.faults
        rec.notes += done.notes
        if entry.fault is not None and done.node is not None:
            fault_node = done.node
        if done.answer is not None:
            answers.append(OperatorAnswer(f"{entry.operator} {done.node or ''}".strip(),
                                          entry.expect, done.answer, done.detail))  # fmt: skip
        at_fault = before if entry.fault is not None else mark.at_fault
        mark = _Mark(time.monotonic(), before, at_fault, watch.count("started"))
    _wait(watch, deadline, "the job to end", partial(_job_over, watch, {}))
    settle = min(deadline.at(watch.first_step_seen), time.monotonic() + SETTLE_S)
    try:
        _wait(watch, settle, "the incidents to close", lambda: _all_closed(watch))
    except ScenarioTimeout:
        still = [f"{i['id']} ({i.get('last_phase') or _last_phase(i)})" for i in watch.incidents
                 if i["status"] != "closed"]  # fmt: skip
        rec.notes.append(f"still open {SETTLE_S:g} s after the job ended: {', '.join(still)}")
        say(f"incidents still open: {', '.join(still)}")
    return answers


def _fired(when: When, watch: Watcher, mark: _Mark) -> bool:
    name, value = when.trigger
    if name == "step":
        return watch.max_step() >= int(str(value))
    if name == "checkpoint":
        return watch.newest_checkpoint() >= int(str(value))
    if name == "after_s":
        ref = mark.at if mark.at is not None else watch.first_step_seen
        return ref is not None and time.monotonic() - ref >= float(str(value))
    if name == "job":
        return watch.requeued() if value == "requeued" else watch.count("started") > mark.started
    incidents = watch.incidents
    if value == "opened":
        return len(incidents) > mark.incidents
    if value == "acted":
        fresh = incidents[mark.incidents :]
        return any(ACTED & {p["name"] for p in i["phases"]} for i in fresh)
    if value == "closed":
        return len(incidents) > mark.at_fault and _all_closed(watch)
    return any(p["name"] == PhaseName.held for i in incidents for p in i["phases"])


def _job_over(watch: Watcher, since: dict[str, float]) -> bool:
    """Whether the job is over for good: COMPLETED, or ended otherwise (FAILED when a fault
    killed its training, NODE_FAIL) and still ended :data:`ENDED_SETTLE_S` later with every
    incident closed: a job a fault ended is requeued by the coordinator, so a first FAILED
    is not the end. ``since`` keeps when it was first seen ended."""
    job = watch.job
    if job is None or not job.finished:
        since.clear()
        return False
    if job.state == "COMPLETED":
        return True
    first = since.setdefault("at", time.monotonic())
    return time.monotonic() - first >= ENDED_SETTLE_S and _all_closed(watch)


def _past(mono: float) -> bool:
    return time.monotonic() >= mono


def _all_closed(watch: Watcher) -> bool:
    return all(i["status"] == "closed" for i in watch.incidents)


def _last_phase(incident: dict[str, Any]) -> str:
    phases = sorted(incident.get("phases", []), key=lambda p: p["at"]["wall"])
    return str(phases[-1]["name"]) if phases else "no phase"


def _wait(
    watch: Watcher,
    deadline: Deadline | float,
    what: str,
    done: Callable[[], bool],
    *,
    fatal_end: bool = False,
    interval_s: float = 0.1,
    light: bool = False,
) -> None:
    """Poll until ``done()``; ScenarioTimeout past ``deadline`` (monotonic, or a
    :class:`Deadline` read against the job's first step as it is seen). With
    ``fatal_end``, a job over for good first (:func:`_job_over`: COMPLETED, or ended and not
    requeued within :data:`ENDED_SETTLE_S`) makes the wait fail (it cannot come true). A job
    a fault just ended is FAILED for a moment before the coordinator requeues it: that is the
    way to a requeue, not the end. ``light``: read only the job's events, with a full poll
    every :data:`LIGHT_FULL_S`."""
    full_at = 0.0
    ended: dict[str, float] = {}
    while True:
        if not light or time.monotonic() >= full_at:
            watch.poll()
            full_at = time.monotonic() + LIGHT_FULL_S
        else:
            watch.poll_events()
        if done():
            return
        if fatal_end and _job_over(watch, ended):
            state = watch.job.state if watch.job is not None else "?"
            raise ScenarioTimeout(f"the job ended ({state}) while waiting for {what}")
        limit = deadline if isinstance(deadline, float) else deadline.at(watch.first_step_seen)
        if time.monotonic() > limit:
            raise ScenarioTimeout(f"timed out waiting for {what}")
        time.sleep(interval_s)


def _incidents(rig: Rig, watch: Watcher, rec: rundir.RunRecord) -> list[dict[str, Any]]:
    """Every incident of the run as ``GET /v1/incidents/{id}`` returns it, oldest first."""
    try:
        summary = rig.client.get("/v1/incidents")
        ordered = sorted(summary, key=lambda i: i["opened"]["wall"])
        return [rig.client.get(f"/v1/incidents/{i['id']}") for i in ordered]
    except RecoverError as e:
        rec.notes.append(f"could not read the incidents from the coordinator: {e}")
        return list(watch.incidents)


def _node_states(rig: Rig, nodes: list[str]) -> dict[str, str]:
    """``in-service``, ``spare`` or ``out`` for each of ``nodes``, as Slurm has them now."""
    states = {}
    for name in nodes:
        node = rig.slurm.node(name)
        states[name] = "spare" if is_spare(node) else "out" if node.out_of_service else "in-service"
    return states


def _report(
    out: Path, rec: rundir.RunRecord, incidents: list[dict[str, Any]]
) -> tuple[ReportSummary | None, str | None]:
    """The report's summary, or None and why it could not be written (then a note in
    ``run.json`` and a failed check: the run directory is this runner's to get right)."""
    try:
        return write_report(out), None
    except Exception as e:  # the run's own checks must still be made and written
        why = f"{type(e).__name__}: {e}"
        rec.notes.append(f"the report failed: {why}")
        rundir.write(out, rec, incidents)
        return None, why
