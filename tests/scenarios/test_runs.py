"""Shipped scenarios run for real: a local Slurm cluster (munged, slurmctld, one slurmd per
node), the coordinator, one agent per node and a JAX training job, each started by the runner
and stopped afterwards. All are ``slow`` (not in the quick tier). The whole tier runs one per
kind of presentation (:data:`WHOLE_TIER`); the rest of the matrix is the ``soak`` tier
(``--soak``; CI runs it too). xid79 is the session's ``recover demo`` run
(tests/plugins/demo_run.py), whose run directory is checked here like the others'.

Each runs as a user runs it: ``recover scenario run NAME --json``. Phase budgets are reported,
not enforced (``--no-budgets``): no timed assertions.
Everything else a scenario expects is checked, and the run directory's format with it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from recovery import statedir
from recovery.contract.memplace import memory_root, node_key
from scenarios.loader import find, shipped
from scenarios.main import DEMO
from scenarios.schema import MODES
from service.daemons import agents as agents_proc
from slurm import procs
from tests.helpers import RECOVER
from tests.plugins.demo_run import DemoRun
from tests.plugins.slurm_cluster import require_2511
from tests.slurm.helpers import require_local_slurm

pytestmark = pytest.mark.slurm

#: On Slurm 22.05, in the whole tier besides `recover demo` (xid79: a fault the agent reads
#: in the kernel log, the node replaced, in-allocation too): the fallback past a corrupt
#: checkpoint and a node that goes silent (slurmd killed). On 25.11 the whole tier runs
#: checkpoint-truncate, xid94 and main-thread-hang (below); in-allocation, slurmd-crash. The
#: other shipped scenarios (the same paths, other sources and policies, each also covered by
#: the engine's tests against the fake Slurm) are in the soak tier.
WHOLE_TIER = ("checkpoint-corrupt", "slurmd-crash")
RUN_KEYS = {"format", "scenario", "started", "finished", "cluster", "job", "faults",
            "control_digest", "final_digest", "notes"}  # fmt: skip


#: The guard scenarios (no fault; the job goes through a long phase and must open no
#: incident) run in both modes: in the whole tier, process 0's slow save requeue-mode (the
#: in-allocation supervisor's own watch has its unit tests and main-thread-hang's real run
#: there); the other seven runs in the soak tier.
GUARD_WHOLE_TIER = (("guard-slow-save", "requeue"),)


def _matrix() -> list[Any]:
    soak = pytest.mark.soak
    return [
        pytest.param(n, marks=() if n in WHOLE_TIER else soak)
        for n in (x.scenario.name for x in shipped() if x.scenario.faults)
        if n != DEMO
    ]


def _guards() -> list[Any]:
    return [
        pytest.param(n, m, marks=() if (n, m) in GUARD_WHOLE_TIER else pytest.mark.soak)
        for n in (x.scenario.name for x in shipped() if not x.scenario.faults)
        for m in MODES
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["checkpoint-truncate", "xid94", "main-thread-hang"])
def test_a_shipped_scenario_passes_on_slurm_2511(
    name: str, control_cache: Path, tmp_path: Path
) -> None:
    """The matrix runs on 22.05; these two run on 25.11, where the job is submitted expedited
    and requeued within a second (the ``job: requeued`` trigger must still see it), and where
    an incident that keeps the node (xid94: restart-app) must not get it drained by our
    Epilog."""
    require_local_slurm()
    require_2511()
    out = tmp_path / "run"
    done = subprocess.run(
        [*RECOVER, "scenario", "run", name, "--out", str(out), "--cache", str(control_cache),
         "--json", "--no-budgets", "--slurm", "25.11"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert "cluster up on Slurm 25.11" in done.stderr
    result = json.loads(done.stdout)
    assert (result["scenario"], result["passed"]) == (name, True)
    if name == "main-thread-hang":  # the agents kept every process's stacks; the report says
        stacks = sorted(p.name for p in (out / "job" / "progress" / "stacks").iterdir())
        assert stacks == [f"rank{r}.txt" for r in range(4)]
        hung = (out / "job" / "progress" / "stacks" / "rank1.txt").read_text()
        assert '"MainThread"' in hung
        assert "_steps (recovery/train/loop.py" in hung  # where its main thread was
        assert "The stacks of the job's processes were taken +" in (out / "report.md").read_text()
    _check_nothing_left(Path(result["cluster_root"]))


@pytest.mark.slow
# xid79 in-allocation is the demo's second run. slurmd-crash hits the job's batch host: the
# supervisor dies with it and the job falls back to a requeue (the coordinator's, on 25.11).
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("gpu-lost", marks=pytest.mark.soak),
        pytest.param("xid95-flood", marks=pytest.mark.soak),
        "slurmd-crash",
    ],
)
def test_a_hard_fault_scenario_passes_in_allocation(
    name: str, control_cache: Path, tmp_path: Path
) -> None:
    """The same scenario with the job holding a spare node (``--mode in-allocation``): its
    supervisor relaunches on the spare, the training restores from a survivor's memory, the
    job is never requeued, and the file's expect_in_allocation holds. Unless the node lost is
    the batch host: then the job is requeued, and still restores from memory."""
    require_local_slurm()
    out = tmp_path / "run"
    done = subprocess.run(
        [*RECOVER, "scenario", "run", name, "--out", str(out), "--cache", str(control_cache),
         "--json", "--no-budgets", "--mode", "in-allocation"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert (result["scenario"], result["passed"]) == (name, True)
    names = {c["name"] for c in result["checks"] if c["ok"]}
    assert "4 node(s) + 1 spare(s) in the job (in-allocation), 4 process(es)" in done.stderr
    if name == "slurmd-crash":
        assert "incident_phases jobs-requeued" in names
        if "cluster up on Slurm 25.11" in done.stderr:  # 22.05 ends such a job itself
            assert "RUNNING without its batch host" in done.stderr
    else:
        assert {"max_requeues", "max_steps_recomputed", "incident_phases in-allocation"} <= names
    doc = json.loads((out / "run.json").read_text())
    restored = [
        json.loads(line)
        for line in (Path(doc["job"]["run_dir"]) / "events.jsonl").read_text().splitlines()
    ]
    restores = [e for e in restored if e["event"] == "restored"]
    sources = [e.get("source") for e in restores]
    # From a survivor's memory, unless the newest checkpoint is newer than every copy (the
    # budget skipped the copy of the step just saved, on a loaded machine), or is the final
    # one (a job that lost its batch host trains on until the coordinator requeues it, and
    # may finish first: a completed run frees its copies). Never for want of a copy.
    first_step = next(i for i, e in enumerate(restored) if e["event"] == "step")
    fallbacks = [e["reason"] for e in restored[first_step:] if e["event"] == "memory-fallback"]
    final = doc["job"]["steps"]
    assert sources == ["memory"] or (
        sources == ["checkpoint"]
        and (
            all("is older than checkpoint step" in r for r in fallbacks)
            or restores[0]["step"] == final
        )
    ), (sources, fallbacks, restores[0]["step"], final)
    _check_nothing_left(Path(result["cluster_root"]))


@pytest.mark.slow
def test_the_demo_is_the_xid79_scenario_and_its_run_directory_is_complete(
    demo_run: DemoRun,
) -> None:
    assert demo_run.done.returncode == 0, demo_run.done.stdout + demo_run.done.stderr
    _check_run_dir(demo_run.out, DEMO)
    # The demo's run directory is short, so its cluster ran right there (not in a temp folder).
    _check_nothing_left(demo_run.out / "cluster")
    assert (demo_run.out / "cluster" / "slurm" / "log").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("name", _matrix())
def test_shipped_scenario_passes(name: str, control_cache: Path, tmp_path: Path) -> None:
    require_local_slurm()
    out = tmp_path / "run"
    done = subprocess.run(
        [*RECOVER, "scenario", "run", name, "--out", str(out), "--cache", str(control_cache),
         "--json", "--no-budgets"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert (result["scenario"], result["passed"], result["out"]) == (name, True, str(out))
    unchecked = [c for c in result["checks"] if c["ok"] is None]
    assert all(c["name"].startswith("phases.") for c in unchecked), unchecked
    # a fault, a crashed node, a hung one, a hung or frozen training process
    progress = ("injected", "SIGKILLed", "hangs:", "main thread blocked", "frozen (SIGSTOP)",
                "throttled to")  # fmt: skip
    assert any(p in done.stderr for p in progress), done.stderr  # progress went to stderr
    # every shipped scenario: K=4 (an in-allocation one holds its spares besides)
    assert re.search(r"4 node\(s\)( \+ \d spare\(s\) in the job \(in-allocation\))?, "
                     r"4 process\(es\)", done.stderr), done.stderr  # fmt: skip
    _check_run_dir(out, name)
    assert (out / "report.md").exists()
    assert result["timeline"] == str(out / "timeline.png")
    _check_nothing_left(Path(result["cluster_root"]))
    assert (out / "cluster" / "slurm" / "log").is_dir()  # the logs stay with the run
    for fault in json.loads((out / "run.json").read_text())["faults"]:
        if fault["fault"] == "cpu-throttle":  # its CPU group went with the run
            assert not list(Path("/sys/fs/cgroup/cpu").glob(f"recover-throttle-*-{fault['pid']}"))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), _guards())
def test_a_guard_scenario_opens_no_incident(
    name: str, mode: str, control_cache: Path, tmp_path: Path
) -> None:
    """Nothing goes wrong, but the job's processes finish no step for far longer than their
    step budget (a slow save, an evaluation, a pause, a slow first step): no incident, no
    requeue, the control's digest. The long phase did happen: process 1 went that long
    without a step."""
    require_local_slurm()
    out = tmp_path / "run"
    done = subprocess.run(
        [*RECOVER, "scenario", "run", name, "--out", str(out), "--cache", str(control_cache),
         "--json", "--no-budgets", "--mode", mode],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert (result["scenario"], result["passed"]) == (name, True)
    held = {c["name"] for c in result["checks"] if c["ok"]}
    assert {"completes", "incidents", "max_requeues", "max_steps_recomputed"} <= held, held
    assert json.loads((out / "incidents.json").read_text()) == []
    doc = json.loads((out / "run.json").read_text())
    assert doc["final_digest"] == doc["control_digest"] is not None
    assert doc["faults"] == []
    long = find(name).scenario.job.long_phases
    assert long is not None
    longest = max(long.save_delay, long.eval_seconds, long.pause_seconds, long.first_step_delay)
    assert _longest_without_a_step(out / "events.rank1.jsonl") >= longest
    _check_nothing_left(Path(result["cluster_root"]))


def _longest_without_a_step(events: Path) -> float:
    """Seconds between a process's warm-up and its first step, or two of its steps, at most."""
    marks = [
        float(e["ts"])
        for e in map(json.loads, events.read_text().splitlines())
        if e["event"] in ("warmup", "step")
    ]
    return max(b - a for a, b in itertools.pairwise(marks))


def _check_run_dir(out: Path, name: str) -> None:
    doc = json.loads((out / "run.json").read_text())
    assert set(doc) == RUN_KEYS
    assert (doc["format"], doc["scenario"]) == (1, name)
    assert doc["started"] < doc["finished"]
    assert doc["final_digest"] == doc["control_digest"] is not None
    assert set(doc["job"]) == {"id", "nodes", "steps", "save_every", "model", "run_dir",
                               "processes"}  # fmt: skip
    # K=4 processes, one per node; an in-allocation job holds its spares besides.
    spares = find(name).scenario.job.job_spares
    assert (doc["job"]["processes"], len(doc["job"]["nodes"])) == (4, 4 + spares)
    for rank in range(1, 4):
        copied = (out / f"events.rank{rank}.jsonl").read_text()
        assert copied == (Path(doc["job"]["run_dir"]) / f"events.rank{rank}.jsonl").read_text()
    assert doc["job"]["nodes"]
    assert set(doc["job"]["nodes"]) <= set(doc["cluster"]["nodes"])
    for fault in doc["faults"]:
        assert {"fault", "node", "via", "at"} <= set(fault)
        assert doc["started"] <= fault["at"] <= doc["finished"]
    incidents = json.loads((out / "incidents.json").read_text())
    assert incidents
    assert all({"id", "phases", "actions", "events"} <= set(i) for i in incidents)
    job_events = Path(doc["job"]["run_dir"]) / "events.jsonl"
    assert (out / "events.jsonl").read_text() == job_events.read_text()
    assert (out / "scenario.yaml").read_text() == find(name).text
    assert json.loads((out / "result.json").read_text())["passed"] is True


def _check_nothing_left(cluster: Path) -> None:
    assert procs.cluster_processes(str(cluster / "slurm")) == set()
    assert agents_proc.running(cluster / "coordinator") == {}
    assert statedir.read_endpoint(cluster / "coordinator") is None
    # Nor the memory tier's copies on its simulated nodes (their tmpfs went with them).
    key = node_key("x", str(cluster / "slurm" / "slurm.conf")).split("@")[1]
    assert not list(memory_root(os.environ).glob(f"*@{key}"))
