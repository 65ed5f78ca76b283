"""The guard scenarios (``faults: []``, a job with ``long_phases``, ``incidents: 0``): the file
format, and proof that each shipped guard can fail.

The proof is pure: the records the scenario's 4-process job writes, step by step and phase by
phase as ``recover train`` writes them (real :class:`ProgressWriter` s on a fake clock, with
the scenario's own numbers), are judged by :class:`StallWatch` once a second as each agent
judges them. By the watcher's rule the job is never stalled; with the long phase left
unannounced (or, for the slow first step, without the first step's start-up budget) it is
stalled for several looks in a row: the real run (tests/scenarios/test_runs.py) would open
an incident, so its passing means something.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.progress import Budgets, Phase, ProgressWriter, StallWatch, Verdict, read_records
from recovery.progress.stall import PHASE_BUDGETS_S
from scenarios.control import cache_key
from scenarios.loader import ScenarioFileError, find, load_text, shipped
from scenarios.schema import JobSpec

GUARDS = [x.scenario.name for x in shipped() if not x.scenario.faults]
PROCESSES = 4
#: Seconds one update of the tiny model takes beside its step sleep.
COMPUTE_S = 0.02
#: Looks in a row a guard's long phase must be judged stalled without its rule: it exceeds
#: the step loop's budget clearly, not by one agent's look.
CLEARLY = 3

GUARD = """\
job:
  steps: 24
  save_every: 8
  long_phases: LONG
faults: []
expect: {incidents: 0}
"""


def test_the_guards_ship() -> None:
    assert GUARDS == ["guard-long-eval", "guard-pause", "guard-slow-compile", "guard-slow-save"]


class _Job:
    """The job's records on a fake clock; the watch looks every second."""

    def __init__(self, directory: Path, watch: StallWatch) -> None:
        self.t = 0.0
        self.dir = directory
        self.watch = watch
        self.writers = [
            ProgressWriter(directory, rank=r, size=PROCESSES, node=f"node{r + 1}",
                           clock=lambda: self.t)
            for r in range(PROCESSES)
        ]  # fmt: skip
        self.next_look = 0.5
        self.looks: list[tuple[float, Verdict]] = []

    def wait(self, seconds: float) -> None:
        end = self.t + seconds
        while self.next_look <= end:
            self.t = self.next_look
            self.looks.append((self.t, self.watch.observe(read_records(self.dir), self.t)))
            self.next_look += 1.0
        self.t = end

    def long_phase(
        self, ranks: range, phase: Phase, seconds: float, after: int, announce: bool
    ) -> None:
        """After step ``after``, ``ranks`` in ``phase`` for ``seconds`` (or silent: still in
        the step loop); the others go into the next step and wait for them at its
        collective."""
        for r in set(range(PROCESSES)) - set(ranks):
            self.writers[r].step_started(after + 1)
        if not announce:
            self.wait(seconds)
            return
        before = [self.writers[r].enter(phase) for r in ranks]
        self.wait(seconds)
        for r, b in zip(ranks, before, strict=True):
            self.writers[r].restore(b)


def _drive(job: JobSpec, directory: Path, *, budgets: Budgets | None = None,
           announce: bool = True) -> list[tuple[float, Verdict]]:  # fmt: skip
    """Every look's verdict over a run of ``job`` as the trainer reports it."""
    long = job.long_phases
    assert long is not None
    run = _Job(directory, StallWatch(budgets))
    lead, everyone = range(1), range(PROCESSES)
    for step in range(1, job.steps + 1):
        for w in run.writers:
            w.step_started(step)
        run.wait(COMPUTE_S + (long.first_step_delay if step == 1 else 0.0))
        for w in run.writers:
            w.step_finished(step)
        if step < job.steps:
            if step % job.save_every == 0 and long.save_delay:
                run.long_phase(lead, Phase.save, long.save_delay, step, announce)
            if long.eval_every and step % long.eval_every == 0:
                run.long_phase(lead, Phase.evaluation, long.eval_seconds, step, announce)
            if step == long.pause_at:
                run.long_phase(everyone, Phase.paused, long.pause_seconds, step, announce)
        run.wait(job.step_sleep)
    return run.looks


@pytest.mark.parametrize("name", GUARDS)
def test_by_the_watchers_rule_the_guard_opens_no_incident(name: str, tmp_path: Path) -> None:
    job = find(name).scenario.job
    looks = _drive(job, tmp_path)
    assert looks
    assert not [(t, v.why) for t, v in looks if v.stalled]


@pytest.mark.parametrize("name", GUARDS)
def test_without_its_rule_the_guard_would_open_one(name: str, tmp_path: Path) -> None:
    """Left unannounced, the save, evaluation or pause is judged by the step loop's learned
    budget; the slow first step without its start-up budget by the unlearned one (60 s)."""
    job = find(name).scenario.job
    assert job.long_phases is not None
    given = {k.split("_")[0] for k, v in job.long_phases.model_dump().items() if v}
    assert len(given) == 1, f"one long phase per guard: {given}"
    if job.long_phases.first_step_delay:
        plain: dict[Phase, float] = {
            p: b for p, b in PHASE_BUDGETS_S.items() if p is not Phase.startup
        }
        looks = _drive(job, tmp_path, budgets=Budgets(phases_s=plain))
    else:
        looks = _drive(job, tmp_path, announce=False)
    stalled = [t for t, v in looks if v.stalled]
    assert len(stalled) >= CLEARLY, (name, stalled)


def test_the_long_phases_reach_the_job_and_not_the_control() -> None:
    s = find("guard-slow-save").scenario
    assert "--save-delay=15" in s.training_args()
    plain = s.job.model_copy(update={"long_phases": None})
    assert cache_key(s.job, PROCESSES) == cache_key(plain, PROCESSES)
    every = find("guard-long-eval").scenario.training_args()
    assert every[-2:] == ["--eval-every=16", "--eval-seconds=15"]


def test_a_guard_loads_without_faults() -> None:
    s = load_text(GUARD.replace("LONG", "{pause_at: 4, pause_seconds: 2.5}"), "g.yaml",
                  default_name="g")  # fmt: skip
    assert s.faults == []
    assert s.job.long_phases is not None
    assert s.job.long_phases.train_args() == ["--pause-at=4", "--pause-seconds=2.5"]
    assert s.expectations().incidents == 0


@pytest.mark.parametrize(
    ("long", "line", "message"),
    [
        ("{pause_at: 24, pause_seconds: 5}", 1,
         "job: long_phases.pause_at 24 is not between two steps of a run of steps 24; "
         "give 1 to 23"),
        ("{pause_at: 4}", 1,
         "job: long_phases.pause_at and long_phases.pause_seconds go together; give both"),
        ("{eval_every: 30, eval_seconds: 5}", 1,
         "job: long_phases.eval_every 30 never evaluates a run of steps 24"),
        ("{eval_seconds: 5}", 1, "job: long_phases.eval_seconds needs long_phases.eval_every"),
        ("{save_delay: -1}", 4, "job.long_phases.save_delay: Input should be greater than or "
         "equal to 0"),
        ("{slow_save: 3}", 4, "job.long_phases.slow_save: unknown key 'slow_save'. Valid keys: "
         "eval_every, eval_seconds, first_step_delay, pause_at, pause_seconds, save_delay"),
    ],
)  # fmt: skip
def test_bad_long_phases_name_the_field_and_what_fits(long: str, line: int, message: str) -> None:
    with pytest.raises(ScenarioFileError) as e:
        load_text(GUARD.replace("LONG", long), "g.yaml", default_name="g")
    assert f"g.yaml:{line}: {message}" in str(e.value)


def test_a_command_job_has_no_long_phases() -> None:
    text = GUARD.replace("LONG", "{save_delay: 5}").replace(
        "job:\n", "job:\n  command: ['{python}', 'train.py', '--run-dir', '{run_dir}']\n"
    )
    with pytest.raises(ScenarioFileError, match="long_phases are recover train options"):
        load_text(text, "g.yaml", default_name="g")


def test_faults_stay_required() -> None:
    with pytest.raises(ScenarioFileError, match="faults: required, but missing"):
        load_text("job: {steps: 4, save_every: 2}\n", "g.yaml", default_name="g")
