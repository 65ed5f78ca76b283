"""The control run's cache: computed once per training configuration, keyed so that anything
that changes the trajectory gets its own run, and safe when the run fails."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from recovery.errors import RecoverError
from scenarios.control import Background, cache_key, control_digest
from scenarios.schema import JobSpec


class Trainer:
    """Stands in for ``recover train``: writes the events a run would, counts its runs."""

    def __init__(self, status: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.status = status

    def __call__(self, args: Sequence[str]) -> tuple[int, str]:
        self.calls.append(list(args))
        run = Path(args[args.index("--run-dir") + 1])
        run.mkdir(parents=True)
        steps = args[args.index("--steps") + 1]
        completed = {"event": "completed", "step": int(steps), "state_digest": f"digest-{steps}"}
        (run / "events.jsonl").write_text(json.dumps(completed) + "\n")
        return self.status, "boom" if self.status else ""


def test_computed_once_per_configuration(tmp_path: Path) -> None:
    train = Trainer()
    job = JobSpec(steps=12, save_every=4)
    assert control_digest(job, tmp_path, train=train) == "digest-12"
    assert control_digest(job, tmp_path, train=train) == "digest-12"
    # save_every and step_sleep do not change the trajectory: the same control run.
    same = JobSpec(steps=12, save_every=3, step_sleep=1.0)
    assert control_digest(same, tmp_path, train=train) == "digest-12"
    assert len(train.calls) == 1
    assert control_digest(JobSpec(steps=16, save_every=4), tmp_path, train=train) == "digest-16"
    assert control_digest(JobSpec(steps=12, save_every=4, seed=1), tmp_path, train=train)
    assert len(train.calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        [cache_key(job), cache_key(JobSpec(steps=16, save_every=4)),
         cache_key(JobSpec(steps=12, save_every=4, seed=1))]
    )  # fmt: skip
    # The run's own files are gone; the digest and the configuration stay.
    assert {p.name for p in (tmp_path / cache_key(job)).iterdir()} == {"digest", "config.json"}


def test_the_run_uses_the_shared_compile_cache(tmp_path: Path) -> None:
    train = Trainer()
    control_digest(JobSpec(steps=4, save_every=2, model="mlp-small"), tmp_path, train=train)
    (args,) = train.calls
    assert args[args.index("--compile-cache") + 1] == str(tmp_path / "compile-cache")
    assert args[args.index("--model") + 1] == "mlp-small"


def test_a_failed_run_raises_and_caches_nothing(tmp_path: Path) -> None:
    with pytest.raises(RecoverError, match=r"the control run failed \(exit 3\):\nboom"):
        control_digest(JobSpec(steps=4, save_every=2), tmp_path, train=Trainer(status=3))
    assert list(tmp_path.iterdir()) == []


def test_background_hands_back_the_digest_or_the_error(tmp_path: Path) -> None:
    assert (
        Background(JobSpec(steps=4, save_every=2), tmp_path, train=Trainer()).result() == "digest-4"
    )
    failing = Background(JobSpec(steps=8, save_every=2), tmp_path, train=Trainer(status=1))
    with pytest.raises(RecoverError, match="exit 1"):
        failing.result()


#: A command job whose "training" logs the value of $PROBE as its final digest.
PROBE_COMMAND = [
    "{python}", "-c",
    "import json, os, sys; os.makedirs(sys.argv[1], exist_ok=True); "
    "open(os.path.join(sys.argv[1], 'events.jsonl'), 'w').write(json.dumps(dict("
    "event='completed', state_digest=os.environ.get('PROBE', 'unset'))))",
    "{run_dir}",
]  # fmt: skip


def test_the_control_run_starts_with_the_scenario_s_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's environment (``RunOptions.env``), not this process's, as the job's."""
    monkeypatch.setenv("PROBE", "this-process")
    job = JobSpec(steps=1, save_every=1, command=PROBE_COMMAND)
    control = Background(job, tmp_path, env={"PROBE": "the-scenario"})
    assert control.result() == "the-scenario"
