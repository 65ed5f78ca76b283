"""A job's own stall thresholds (issue 27: "overridable per job"): checked with errors that
name what is valid, kept beside the records by process 0 (``open_progress(budgets=...)`` or
``$RECOVER_STALL_BUDGETS``), and taken by the node agent's judgement of that job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.progress import ProgressSource
from recovery.api.progress import ENV_STALL_BUDGETS, open_progress
from recovery.errors import UsageError
from recovery.ports.clock import FakeClock
from recovery.progress import Budgets, Phase, ProgressWriter, job_budgets, write_job_budgets
from recovery.progress.stall import BUDGETS_FILE


def test_overrides_merge_phases_and_keep_the_rest() -> None:
    b = Budgets().overridden({"floor_s": 30, "learn_after": 3, "phases_s": {"save": 1800}})
    assert (b.floor_s, b.learn_after, b.factor) == (30.0, 3, Budgets().factor)
    assert b.phases_s[Phase.save] == 1800.0
    assert b.phases_s[Phase.evaluation] == Budgets().phases_s[Phase.evaluation]


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"flor_s": 1}, "Unknown stall budgets: key 'flor_s'. Known: factor, floor_s"),
        ({"floor_s": 0}, "floor_s must be > 0"),
        ({"factor": "ten"}, "factor: expected a number (got 'ten')"),
        ({"learn_after": 2.5}, "learn_after: expected a whole number"),
        ({"phases_s": {"sav": 10}}, "phase 'sav'. Known: data, evaluation, paused, restore"),
        ({"phases_s": {"steps": 10}}, "phase 'steps'"),
        ({"phases_s": {"save": -1}}, "save must be > 0 seconds"),
        ({"phases_s": [1]}, "phases_s: expected phase: seconds"),
        ([1, 2], "expected a mapping of floor_s"),
        ({"straggler": {"until_step": -1}}, "until_step >= 0"),
        ({"straggler": {"swap_cost_s": -5}}, "swap_cost_s >= 0"),
        ({"straggler": {"until": 9}}, "key 'until'"),
    ],
)
def test_bad_overrides_are_refused_naming_what_is_valid(changes: object, said: str) -> None:
    with pytest.raises(UsageError, match=None) as e:
        Budgets().overridden(changes)  # type: ignore[arg-type]
    assert said in str(e.value)


def test_the_file_round_trips_and_a_bad_one_falls_back_to_the_defaults(tmp_path: Path) -> None:
    assert job_budgets(tmp_path, Budgets()) == (Budgets(), None)
    write_job_budgets(tmp_path, {"floor_s": 45})
    assert job_budgets(tmp_path, Budgets())[0].floor_s == 45.0
    (tmp_path / BUDGETS_FILE).write_text("{not json")
    base = Budgets(floor_s=7.0)
    budgets, error = job_budgets(tmp_path, base)
    assert budgets == base
    assert error is not None
    assert "judged by the defaults" in error


def _env(tmp_path: Path, rank: int, **extra: str) -> dict[str, str]:
    return {
        "RECOVER_PROCESS_ID": str(rank),
        "RECOVER_NUM_PROCESSES": "2",
        "RECOVER_RENDEZVOUS": "127.0.0.1:1",
        "RECOVER_PROGRESS_REGISTRY": str(tmp_path / "registry"),
        **extra,
    }


def test_process_0_keeps_the_jobs_budgets_from_the_environment(tmp_path: Path) -> None:
    wanted = {"floor_s": 30, "phases_s": {"evaluation": 7200}}
    env = _env(tmp_path, 0, **{ENV_STALL_BUDGETS: json.dumps(wanted)})
    writer = open_progress(tmp_path / "run", environ=env)
    writer.close()
    assert json.loads((tmp_path / "run" / "progress" / BUDGETS_FILE).read_text()) == wanted
    other = open_progress(tmp_path / "run2", budgets={"floor_s": 9}, environ=_env(tmp_path, 1))
    other.close()
    assert not (tmp_path / "run2" / "progress" / BUDGETS_FILE).exists()  # only process 0 keeps them


@pytest.mark.parametrize(
    ("rule", "kept"),
    [
        ({"swap": True}, {"swap": True, "until_step": 500}),
        ({"swap": True, "until_step": 9}, {"swap": True, "until_step": 9}),
        ({"factor": 2}, {"factor": 2}),  # no swaps asked: the steps left do not matter
    ],
)
def test_a_job_asking_for_swaps_is_told_the_step_it_trains_to(
    tmp_path: Path, rule: dict[str, object], kept: dict[str, object]
) -> None:
    writer = open_progress(
        tmp_path / "run", budgets={"straggler": rule}, environ=_env(tmp_path, 0), until_step=500
    )
    writer.close()
    saved = json.loads((tmp_path / "run" / "progress" / BUDGETS_FILE).read_text())
    assert saved == {"straggler": kept}


@pytest.mark.parametrize(
    ("value", "said"),
    [("{floor", f"${ENV_STALL_BUDGETS} is not JSON"), ('{"floor": 3}', "key 'floor'")],
)
def test_bad_budgets_in_the_environment_stop_the_loop_before_anything_is_written(
    tmp_path: Path, value: str, said: str
) -> None:
    with pytest.raises(UsageError) as e:
        open_progress(tmp_path / "run", environ=_env(tmp_path, 0, **{ENV_STALL_BUDGETS: value}))
    assert said in str(e.value)
    assert not (tmp_path / "run" / "progress").exists()


@pytest.mark.parametrize(("floor_s", "reported"), [(None, True), (60.0, False)])
def test_the_agent_judges_a_job_by_its_own_budgets(
    tmp_path: Path, floor_s: float | None, reported: bool
) -> None:
    """Two processes of one job on this node stop finishing steps; 20 s later the agent
    reports the hang by the defaults, and not when the job allows 60 s."""
    clock = FakeClock()
    directory, registry = tmp_path / "progress", tmp_path / "registry"
    if floor_s is not None:
        write_job_budgets(directory, {"floor_s": floor_s})
    writers = [
        ProgressWriter(directory, rank=r, size=2, node="n1", registry=registry, job="5",
                       clock=lambda: clock.now().wall)
        for r in (0, 1)
    ]  # fmt: skip
    source = ProgressSource(
        "n1", clock, registry, budgets=Budgets(learn_after=2), stacks=lambda _pid: "",
        log=lambda _line: None,
    )  # fmt: skip
    events = []
    for step in range(1, 6):
        clock.advance(0.5)
        for w in writers:
            w.step_finished(step)
        events += source.tick()
    writers[0].step_started(6)  # process 1 never enters step 6
    for _ in range(20):
        clock.advance(1.0)
        for w in writers:
            w.alive()
        events += source.tick()
    for w in writers:
        w.close()
    assert [e.fault for e in events] == (["rank-hang"] if reported else [])
