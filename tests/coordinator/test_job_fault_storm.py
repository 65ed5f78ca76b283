"""No false drains, on the real coordinator: one job crashes on 16 nodes of a real Slurm
cluster, and every node's agent (a real process reading its kernel log) reports the XID 13,
31, 43 and 45 lines such a crash produces. Nothing is taken out. The same job crashing again,
after its first incidents went quiet, is a new episode on every node and still takes none
out: a job's own crash is never escalated.

Its own cluster (16 nodes and a spare), not the session's: a storm needs the nodes. The
coordinator runs with short flood and correlation windows so that the second crash is a new
episode within the test's time; escalation keeps its default window.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.faultline import format_fault_line
from agents.ids import read_boot_id
from agents.inject import simulated_bus
from agents.kmsg import kmsg_event_id, parse_line
from recovery import proc
from recovery.ports.clock import SystemClock
from recovery.ports.slurm import BatchJob
from recovery.statedir import JOURNAL_FILE
from service.daemons import agents as agents_proc
from service.daemons import coordinator as coordinator_proc
from service.journaldb.journal import SqliteJournal
from slurm import procs
from slurm.cluster import LocalCluster
from tests.coordinator.helpers import SHIM, Coordinator
from tests.slurm.helpers import SLURMD_TIMEOUT_S, require_local_slurm, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES = [f"node{i}" for i in range(1, 17)]
#: The policy's short windows (seconds): a quiet spell longer than FLOOD_S ends an episode.
FLOOD_S = 4.0
POLICY = f"flood_window_s: {FLOOD_S}\ncorrelation_window_s: {FLOOD_S}\n"
#: What a crash of the job prints on one node: per GPU an exception (13), a page fault on
#: one (31), the GPU stopping its work (43) and the driver's cleanup (45, twice).
PID, NAME = 40522, "python3"


def crash_lines(gpus: range, t0: float) -> list[str]:
    lines = []
    for g in gpus:
        lines.append(format_fault_line("xid13", simulated_bus(g), pid=PID, process=NAME))
    lines.append(format_fault_line("xid31", simulated_bus(gpus[0]), pid=PID, process=NAME))
    for fault in ("xid43", "xid45", "xid45"):
        for g in gpus:
            lines.append(format_fault_line(fault, simulated_bus(g), pid=PID, process=NAME))
    return [f"[{t0 + i / 1000:12.6f}] {line}" for i, line in enumerate(lines)]


def expected_ids(node: str, lines: list[str], boot: str) -> list[str]:
    """The ids the node's agent sends for ``lines``: the first line of each (fault, GPU) at
    once, then ``<first>.r`` for the repeats its deduplicator folded."""
    first: dict[tuple[str, str | None], str] = {}
    repeated: set[str] = set()
    for line in lines:
        fault = parse_line(line)
        assert fault is not None
        key = (fault.fault, fault.bus_id)
        if key in first:
            repeated.add(first[key])
        else:
            first[key] = kmsg_event_id(node, boot, fault)
    return [*first.values(), *(f"{i}.r" for i in first.values() if i in repeated)]


@pytest.fixture(scope="module")
def storm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_local_slurm()
    cluster = LocalCluster(
        tmp_path_factory.mktemp("storm-cluster"), slurmd_timeout_s=SLURMD_TIMEOUT_S
    )
    cluster.up(nodes=len(NODES), spares=1, timeout_s=120)
    try:
        yield cluster
    finally:
        cluster.down()
        left = procs.cluster_processes(str(cluster.state_dir))
        assert not left, f"processes left behind after cluster down: {sorted(left)}"


@pytest.fixture
def storm(storm_cluster: LocalCluster, tmp_path: Path) -> Iterator[Coordinator]:
    """The real coordinator (scontrol logged by a shim) and an agent per node."""
    real = shutil.which("scontrol")
    assert real is not None
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "scontrol.log"
    (shim_dir / "scontrol").write_text(SHIM.format(log=log, real=real))
    (shim_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}"}
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    c = Coordinator(tmp_path / "coordinator", storm_cluster.conf_path, env, log)
    c.endpoint = coordinator_proc.start(
        c.state_dir, slurm_conf=storm_cluster.conf_path, config=policy, env=env
    )
    try:

        def connected() -> set[str]:
            return {a["node"] for a in c.client.get("/v1/agents") if a["connected"]}

        agents_proc.start_agents(
            c.state_dir, NODES, c.endpoint.url, connected=connected, timeout_s=180
        )
        yield c
    finally:
        agents_proc.stop_agents(c.state_dir)
        coordinator_proc.stop(c.state_dir)
        assert not proc.alive(c.endpoint.pid), "coordinator left running"
        storm_cluster.control().run(["scancel", "--user=root"])


def decisions(c: Coordinator, ids_by_node: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The coordinator's decision on each event id (read from its journal, as a second
    reader: one query, where the API's per-event lookup reads the whole journal each time),
    or [] while one is missing."""
    journal = SqliteJournal(c.state_dir / JOURNAL_FILE, SystemClock(), checkpoint_every_s=None)
    try:
        decided = {s.event.id: d for s, d in journal.history() if d is not None}
    finally:
        journal.close()
    wanted = [i for ids in ids_by_node.values() for i in ids]
    if not all(i in decided for i in wanted):
        return []
    return [decided[i].to_json() for i in wanted]


def lines_now(ids_by_node: dict[str, list[str]]) -> dict[str, list[str]]:
    """The ids sent at once (not the summaries that leave when a window ends)."""
    return {n: [i for i in ids if not i.endswith(".r")] for n, ids in ids_by_node.items()}


def write_crash(c: Coordinator, gpus: range, t0: float, boot: str) -> dict[str, list[str]]:
    """Every node's kernel log gets the crash's lines; returns each node's expected ids."""
    ids = {}
    for n in NODES:
        lines = crash_lines(gpus, t0)
        with open(agents_proc.kmsg_file(c.state_dir, n), "a") as f:
            f.write("".join(line + "\n" for line in lines))
        ids[n] = expected_ids(n, lines, boot)
    return ids


def test_one_job_crash_on_16_nodes_takes_no_node_out(
    storm: Coordinator, storm_cluster: LocalCluster, tmp_path: Path
) -> None:
    ctl = storm_cluster.control()
    flag = tmp_path / "crash"
    job_id = ctl.submit(
        BatchJob(
            script=f"#!/bin/bash\nwhile [ ! -e {flag} ]; do sleep 0.2; done\nexit 134\n",
            options={
                "nodes": str(len(NODES)),
                "requeue": None,
                "job-name": "storm",
                "output": str(tmp_path / "slurm-%j.out"),
            },
            workdir=str(tmp_path),
        )
    )
    wait_for(lambda: any(j.job_id == job_id and j.state == "RUNNING" for j in ctl.jobs()), 60,
             "the job running on all 16 nodes")  # fmt: skip
    boot = read_boot_id()

    # The crash: every GPU of every node reports it; the training process dies with it.
    first = write_crash(storm, range(0, 4), 1000.0, boot)
    flag.touch()
    got = wait_for(lambda: decisions(storm, lines_now(first)), 120, "the first crash decided")
    last = time.time()

    # The same job crashing again after a quiet spell (a new episode; on other GPUs, so the
    # agents' deduplication windows of the first crash do not fold it).
    wait_for(lambda: time.time() - last > FLOOD_S + 1, FLOOD_S + 10, "the first episode to end")
    second = write_crash(storm, range(4, 8), 2000.0, boot)
    got += wait_for(lambda: decisions(storm, lines_now(second)), 120, "the second crash decided")

    # The agents leave with the summaries of what they folded (XID 45 repeats).
    agents_proc.stop_agents(storm.state_dir)
    summaries = {n: [i for i in (*first[n], *second[n]) if i.endswith(".r")] for n in NODES}
    assert sum(len(s) for s in summaries.values()) == 2 * len(NODES) * 4  # 45 twice, 4 GPUs
    got += wait_for(lambda: decisions(storm, summaries), 60, "a decision on every summary")

    verdicts = {d["verdict"] for d in got}
    assert verdicts <= {"restart-app", "ignore"}, verdicts
    assert not [d for d in got if d["escalated_from"]], "a job's crash was escalated"
    opened = [d for d in got if d["opens"]]
    assert sorted(d["node"] for d in opened) == sorted(NODES * 2)  # one incident per episode
    assert all(d["node_failure"] is False for d in opened)
    # Slurm agrees: no node was set DOWN or drained, every node is in service.
    updates = storm.scontrol_updates()
    assert not [u for u in updates if "state=down" in u.lower() or "state=drain" in u.lower()]
    nodes = {n.name: n for n in ctl.nodes()}
    assert all(nodes[n].in_service for n in NODES), {n: nodes[n].state for n in NODES}
    incidents = storm.incidents()
    assert len(incidents) == 2 * len(NODES)
    assert {i["verdict"] for i in incidents} == {"restart-app"}
