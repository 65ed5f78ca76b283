"""Scenario files: every shipped one loads; a malformed one is answered with the file, the line,
the field path and what is valid, for every kind of mistake the schema can catch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.report.phases import PHASES
from scenarios.loader import (
    Loaded,
    ScenarioFileError,
    find,
    load_file,
    load_text,
    shipped,
    with_mode,
)
from scenarios.schema import SPECIAL_FAULTS, Entry
from tests.helpers import RECOVER

GOOD = """\
description: a test
cluster: {nodes: 4, spares: 1}
job:
  steps: 20
  save_every: 4
faults:
  - fault: xid79
    when: {step: 4}
"""


def _error(text: str) -> str:
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "s.yaml", default_name="s")
    return str(e.value)


def test_every_shipped_scenario_loads_and_describes_itself() -> None:
    found = shipped()
    names = {x.scenario.name for x in found}
    assert {"xid79", "xid94", "slurmd-crash", "breaker-burst", "no-spare"} <= names
    for x in found:
        assert x.scenario.description, f"{x.path} has no description"
        assert x.path is not None
        assert x.scenario.name == x.path.stem


def test_a_good_file_loads_with_its_defaults() -> None:
    s = load_text(GOOD, "s.yaml", default_name="s")
    assert (s.name, s.job.nodes, s.job.model, s.cluster.cred_expire_s) == (
        "s",
        "all",
        "mlp-tiny",
        10,
    )
    (entry,) = s.faults
    assert (entry.where, entry.path, entry.kills_training) == ("job-node", "agent", True)
    assert entry.when.trigger == ("step", 4)
    assert s.expect.completes
    assert s.expect.digest_matches_control


@pytest.mark.parametrize(
    ("text", "line", "where", "says"),
    [
        (GOOD.replace("xid79", "xid99"), 7, "faults[0].fault",
         ["Unknown fault 'xid99'. Known: ", "xid79", "gpu-lost", "slurmd-crash"]),
        (GOOD + "    via: kmesg\n", 9, "faults[0].via", ["'agent' or 'kmsg'", "got 'kmesg'"]),
        (GOOD.replace("  steps: 20", "  stepz: 20"), 4, "job.stepz",
         ["unknown key 'stepz'. Valid keys: command, long_phases, mode, model, nodes, processes, "
          "save_every, seed, spares, step_sleep, steps"]),
        (GOOD.replace("  steps: 20\n", ""), 3, "job.steps", ["required, but missing"]),
        ("descripton: x\n" + GOOD, 1, "descripton",
         ["unknown key 'descripton'. Valid keys: cluster, description, expect, "
          "expect_in_allocation, faults, job"]),
        (GOOD.replace("{step: 4}", "{step: 4, checkpoint: 4}"), 8, "faults[0].when",
         ["give exactly one of step, checkpoint, after_s, job, incidents (got step, checkpoint)"]),
        (GOOD.replace("{step: 4}", "{job: crashed}"), 8, "faults[0].when.job",
         ["'requeued' or 'restarted'", "got 'crashed'"]),
        (GOOD + "expect:\n  verdicts: [replace, reboot]\n", 10, "expect.verdicts[1]",
         ["'ignore', 'observe', 'restart-app', 'drain-reset' or 'replace'", "got 'reboot'"]),
        (GOOD + "expect:\n  phases: {detecton: 4}\n", 10, "expect.phases.detecton",
         ["'detection'", "'no_progress'", "got 'detecton'"]),
        (GOOD.replace("  save_every: 4", "  save_every: 4\n  model: mlp-huge"), 6, "job.model",
         ["Unknown model 'mlp-huge'. Known: mlp-1g, mlp-medium, mlp-small, mlp-tiny"]),
        (GOOD.replace("{nodes: 4, spares: 1}", "{nodes: 4, policy: {breaker: {max_fraction: 2}}}"),
         2, "cluster.policy", ["max_fraction: expected a fraction 0-1, got 2"]),
        (GOOD.replace("{nodes: 4, spares: 1}", "{nodes: 4, cred_expire_s: 2}"), 2,
         "cluster.cred_expire_s", ["greater than or equal to 5"]),
        (GOOD + "    node: node9\n", 9, "faults[0].node",
         ["Unknown node 'node9'. Known: fault-node, job-node, node1, node2, node3, node4, spare1"]),
        (GOOD.replace("xid79", "tpu-runtime-error") + "    via: kmsg\n", 7, "faults[0]",
         ["cannot write a kernel line for fault 'tpu-runtime-error'", "XID lines only"]),
        (GOOD + "    operator: repaired\n", 7, "faults[0]",
         ["give exactly one of fault (what to break) or operator (what to do)"]),
        (GOOD + "  - fault: checkpoint-corrupt\n    node: node1\n", 9, "faults[1]",
         ["node does not apply to checkpoint-corrupt"]),
        (GOOD + "  - operator: repaired\n    via: kmsg\n", 9, "faults[1]",
         ["via does not apply to operator repaired"]),
        (GOOD + "    burst: 5\n", 9, "faults[0].burst", ["5 nodes, but the job runs on 4"]),
        (GOOD.replace("  steps: 20", "  steps: 20\n  processes: 5"), 5, "job.processes",
         ["5 processes, one per node, but the job has 4 node(s)", "ask for at most 4"]),
        (GOOD.replace("  steps: 20", "  steps: 20\n  nodes: 2\n  processes: 3"), 6,
         "job.processes", ["3 processes, one per node, but the job has 2 node(s)"]),
        (GOOD.replace("{nodes: 4, spares: 1}", "{nodes: 3, spares: 1}"), 3, "job.model",
         ["mlp-tiny's batch of 32 does not divide over 3 processes", "mlp-tiny-48"]),
        (GOOD.replace("  steps: 20", "  steps: 20\n  processes: many"), 5, "job.processes",
         ["expected 'per-node' or a whole number 1-16, got 'many'"]),
        (GOOD.replace("{nodes: 4, spares: 1}", "{existing: {}}").replace("xid79", "slurmd-crash"),
         7, "faults[0].fault", ["slurmd-crash needs the local cluster"]),
        (GOOD + "expect:\n  out_of_service: [node7]\n", 10, "expect.out_of_service[0]",
         ["Unknown node 'node7'. Known: node1, node2, node3, node4, spare1"]),
        (GOOD.replace("job:\n", "job: [1]\njob2:\n"), 3, "job", ["valid dictionary"]),
    ],
)  # fmt: skip
def test_a_malformed_file_names_line_field_and_choices(
    text: str, line: int, where: str, says: list[str]
) -> None:
    message = _error(text)
    prefix = f"s.yaml:{line}: {where}: "
    found = [ln for ln in message.splitlines() if ln.startswith(prefix)]
    assert found, message
    for part in says:
        assert part in found[0]


def test_every_problem_is_listed_one_line_each() -> None:
    text = GOOD.replace("xid79", "xid99") + "    via: kmesg\n    colour: red\n"
    lines = _error(text).splitlines()
    assert [ln.split(": ")[1] for ln in lines] == ["faults[0].fault", "faults[0].via",
                                                  "faults[0].colour"]  # fmt: skip
    assert lines[2] == (
        "s.yaml:10: faults[0].colour: unknown key 'colour'. Valid keys: burst, cpu_percent, "
        "crash_training, expect, fault, gpu, node, operator, repeat, restart, via, when"
    )


def test_not_yaml_and_not_a_mapping_are_named_too() -> None:
    assert _error("job: {steps: 4\nfaults: []\n").startswith("s.yaml:2: not valid YAML:")
    assert _error("- just\n- a list\n") == "s.yaml:1: expected a mapping of scenario keys, got list"
    assert "got an empty file" in _error("")


def test_the_docs_list_every_phase_and_special_fault() -> None:
    from scenarios import schema

    doc = schema.__doc__ or ""
    for name in (*PHASES, *SPECIAL_FAULTS):
        assert f"``{name}``" in doc, name
    user_doc = (Path(__file__).parents[2] / "docs" / "scenarios.md").read_text()
    for name in (*PHASES, *SPECIAL_FAULTS, *Entry.model_fields):
        assert f"`{name}`" in user_doc, name


def test_find_takes_a_shipped_name_or_a_file(tmp_path: Path) -> None:
    assert find("xid79").scenario.name == "xid79"
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD)
    assert find(str(path)).scenario.name == "mine"
    with pytest.raises(Exception, match=r"Unknown scenario .*'xid7'. Known: .*xid79"):
        find("xid7")
    with pytest.raises(ScenarioFileError, match="no such file"):
        find(str(tmp_path / "absent.yaml"))
    assert load_file(path).text == GOOD


def test_the_cli_refuses_a_malformed_file_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("xid79", "xid99"))
    done = subprocess.run([*RECOVER, "scenario", "run", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{path}:7: faults[0].fault: Unknown fault 'xid99'. Known: " in done.stderr


def test_the_cli_lists_the_shipped_scenarios() -> None:
    done = subprocess.run([*RECOVER, "scenario", "list"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0].split() == ["NAME", "DESCRIPTION"]
    for x in shipped():
        assert any(r.split(maxsplit=1) == [x.scenario.name, x.scenario.description] for r in rows)


def test_a_scenario_moves_between_modes_keeping_its_training_nodes() -> None:
    """``--mode in-allocation`` on a requeue file: the job holds one spare, the local cluster
    one more node so the job trains on as many; the file's expect_in_allocation fields
    replace expect's, the others are kept; and back again."""
    text = GOOD + "expect_in_allocation:\n  max_steps_recomputed: 1\n  max_requeues: 0\n"
    base = Loaded(load_text(text, "s.yaml", default_name="s"), text, None)
    assert base.scenario.job.job_spares == 0
    moved = with_mode(base, "in-allocation").scenario
    assert (moved.job.mode, moved.job.job_spares) == ("in-allocation", 1)
    assert moved.cluster.nodes == base.scenario.cluster.nodes + 1
    expect = moved.expectations()
    assert (expect.max_steps_recomputed, expect.max_requeues) == (1, 0)
    assert expect.verdicts == base.scenario.expect.verdicts  # kept
    assert base.scenario.expectations() == base.scenario.expect
    back = with_mode(with_mode(base, "in-allocation"), "requeue").scenario
    assert back.cluster.nodes == base.scenario.cluster.nodes
    assert back.job.job_spares == 0
    assert with_mode(base, None) is base


@pytest.mark.parametrize(
    ("job", "says"),
    [
        ("mode: requeue, spares: 1", "spares 1 needs mode in-allocation"),
        ("mode: in-allocation, spares: 0", "spares 0 is the requeue mode"),
        ("mode: in-allocation, spares: 4", "job.spares: 4 spare(s) in the job leave no node"),
        ("mode: in-allocation, nodes: 3, spares: 2", "at most 1 spare(s) fit"),
        ("mode: elastic", "'requeue' or 'in-allocation'"),
    ],
)
def test_bad_modes_and_spares_are_named(job: str, says: str) -> None:
    text = (
        "cluster: {nodes: 4, spares: 1}\n"
        f"job: {{steps: 20, save_every: 4, {job}}}\n"
        "faults: [{fault: xid79}]\n"
    )
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "s.yaml", default_name="s")
    assert says in str(e.value)


def test_an_unknown_mode_on_the_command_line_names_the_modes() -> None:
    with pytest.raises(UsageError) as e:
        with_mode(find("xid79"), "hot")
    assert "Unknown mode 'hot'. Known: in-allocation, requeue" in str(e.value)


def test_a_scenario_that_waits_for_a_requeue_cannot_run_in_allocation() -> None:
    with pytest.raises(ScenarioFileError) as e:
        with_mode(find("checkpoint-truncate"), "in-allocation")
    assert "(--mode in-allocation): faults[1].when: job: requeued never fires" in str(e.value)


THROTTLE = GOOD.replace("  - fault: xid79\n", "  - fault: cpu-throttle\n    node: node2\nEXTRA")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("", "cpu-throttle needs cpu_percent (1-99: the share of a CPU left)"),
        ("    cpu_percent: 0\n", "faults[0].cpu_percent"),
        ("    cpu_percent: 100\n", "faults[0].cpu_percent"),
    ],
)
def test_a_cpu_throttle_needs_a_share_of_a_cpu(extra: str, says: str) -> None:
    assert says in _error(THROTTLE.replace("EXTRA", extra))


def test_cpu_percent_belongs_to_the_throttle_only() -> None:
    text = GOOD.replace("  - fault: xid79\n", "  - fault: xid79\n    cpu_percent: 25\n")
    assert "cpu_percent does not apply to xid79" in _error(text)
    ok = load_text(THROTTLE.replace("EXTRA", "    cpu_percent: 25\n"), "s.yaml", default_name="s")
    assert ok.faults[0].cpu_percent == 25
