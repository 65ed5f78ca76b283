"""The storm benchmark's rig on real daemons: a local Slurm cluster with one job per node, the
real coordinator, a storm of faults, and each node's DOWN as slurmctld logged it.

The command and its report are :mod:`benchmarks.storm_bench`; the events' sending and the
readings of slurmctld's log are :mod:`benchmarks.storm_read`. ``tests/coordinator/test_storm.py``
runs the same rig at a small size, so what the benchmark measures is also what a test checks.

Layout under one temporary root (short: slurmstepd's socket paths must fit in 107 bytes)::

    ROOT/slurm          the cluster (slurm.cluster.LocalCluster)
    ROOT/coordinator    the coordinator and the agents (service.bringup.coordinator_dir)
    ROOT/shim/scontrol  logs every scontrol call the coordinator makes, then runs the real one
    ROOT/policy.yaml    the breaker lifted above the storm, so that every node is taken out

Everything is started by pid and stopped by pid (:meth:`Rig.close`), which then looks for
anything left behind.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.storm_read import (
    SHIM,
    healthy_changes,
    incident_latencies,
    log_size,
    log_text,
    logged_downs,
    promotions,
    send_events,
    stages,
    summary,
    update_calls,
)
from recovery import proc
from recovery.errors import UsageError, unknown_choice
from recovery.ports.slurm import JobInfo, NodeInfo, SlurmControl
from recovery.statedir import TOKENS_FILE, Endpoint
from service import bringup, wiring
from service.daemons import agents as agents_proc
from service.daemons import coordinator as coordinator_proc
from service.httpapi.auth import load_tokens
from service.httpapi.client import Client, admin_token
from slurm import install, procs, rest_slurm
from slurm.cluster import LocalCluster
from slurm.install import choose

#: The fault every node of the storm reports: the GPU fell off the bus (verdict: replace).
FAULT = "xid79"
#: What each node's job runs: a stand-in that lives until Slurm ends it (a DOWN requeues it).
JOB = ["--wrap", "exec sleep 1000000"]


@dataclass(frozen=True)
class StormOptions:
    """One storm on a real cluster. Times in seconds."""

    nodes: int = 256
    """Compute nodes, each running one single-node job."""
    spares: int = 8
    faulted: int = 150
    """Nodes that fail at once."""
    agents: int = 4
    """How many of the faulted nodes report through a real agent reading a kernel line; the
    others are POSTed to the intake with their own tokens, as their agents would."""
    backend: str = "cli"
    """How the coordinator reaches Slurm (``recover coordinator serve --slurm-backend``)."""
    slurm: str | None = None
    """Which Slurm the cluster runs (``recover cluster up --slurm``: auto, 25.11, 22.05;
    None: Debian's 22.05, as every storm measured before the option)."""
    jobs: bool = True
    """One job per compute node (False: idle nodes)."""
    seed: int = 1
    deadline_s: float = 60.0
    """From the storm to every faulted node DOWN (and its take-down recorded)."""
    up_timeout_s: float = 180.0
    """For the cluster's start and for every job to run."""

    def check(self) -> None:
        """Raise UsageError for options that cannot run, naming what is valid."""
        if self.backend not in wiring.SLURM_BACKENDS:
            raise unknown_choice("backend", self.backend, wiring.SLURM_BACKENDS)
        if not 1 <= self.faulted <= self.nodes:
            raise UsageError(f"Invalid --faulted {self.faulted}: expected 1 to {self.nodes}")
        if not 0 <= self.agents <= self.faulted:
            raise UsageError(f"Invalid --agents {self.agents}: expected 0 to {self.faulted}")


@dataclass
class StormResult:
    """What one storm measured (seconds) and what it found wrong."""

    options: dict[str, Any]
    faulted: list[str]
    via_agent: list[str]
    fault_to_down: dict[str, Any]
    """Fault -> DOWN as slurmctld logged it, per faulted node (summarized)."""
    down_s: list[float]
    """The same, each faulted node's (sorted)."""
    receipt_to_takedown: dict[str, Any]
    """Receipt at the intake -> take-down recorded done, from the coordinator's incidents
    (what ``decision_bench`` measures)."""
    post_answered: dict[str, Any]
    """Fault -> the intake's answer, per POSTed node (the answer follows the commit)."""
    promoted: dict[str, Any]
    """Fault -> spare promoted (recorded), per spare the storm took."""
    not_down: list[str]
    """Faulted nodes slurmctld did not log DOWN by the deadline."""
    problems: list[str]
    """A healthy node changed, a faulted one lacks our reason, an incident is missing."""
    stages: dict[str, dict[str, Any]]
    """Where fault -> DOWN went (:func:`benchmarks.storm_read.stages`)."""
    updates: list[str] | None
    """Every ``scontrol update`` the coordinator ran (None: not the CLI backend)."""
    slurm: str
    """``scontrol --version`` of the cluster, e.g. ``slurm-wlm 22.05.8``."""
    up_s: float
    jobs_s: float
    memory_mb: float
    """What the cluster's processes (slurmctld, every slurmd, munged, the jobs) held in
    memory (resident, MiB) once every job ran."""
    load: tuple[float, float, float]
    """The machine's load average (1, 5, 15 min) as the storm began."""


def resident_mb(pids: set[int]) -> float:
    """The resident memory of ``pids`` together (MiB, from ``/proc/PID/status``); a process
    gone meanwhile counts nothing."""
    total_kb = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])
    return round(total_kb / 1024, 1)


def load_average() -> tuple[float, float, float]:
    """The machine's load average over 1, 5 and 15 minutes."""
    a, b, c = os.getloadavg()
    return (round(a, 2), round(b, 2), round(c, 2))


class Rig:
    """One cluster with its coordinator. Use as a context manager: leaving it stops every
    process by pid; :attr:`leftovers` then names anything still running."""

    def __init__(
        self, opts: StormOptions, root: Path, *, log: Callable[[str], None] = lambda _m: None
    ) -> None:
        opts.check()
        self.opts, self.root, self._log = opts, root, log
        self.state = root / "slurm"
        self.coord_dir = bringup.coordinator_dir(self.state)
        install = choose(opts.slurm) if opts.slurm is not None else None
        self.cluster = LocalCluster(self.state, jwt=opts.backend == "rest", install=install)
        self.ctl = self.cluster.control()
        self.endpoint: Endpoint | None = None
        self.agent_pids: dict[str, int] = {}
        self.leftovers: list[str] = []
        self.up_s = self.jobs_s = self.memory_mb = 0.0

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- start ------------------------------------------------------------------------------

    def start(self) -> None:
        """The cluster, a job on every node, the coordinator (and the agents), in that order."""
        began = time.monotonic()
        info = self.cluster.up(
            nodes=self.opts.nodes, spares=self.opts.spares, timeout_s=self.opts.up_timeout_s
        )
        self.up_s = time.monotonic() - began
        # Made again now that the conf names the install: made before, it ran the commands
        # on PATH (Debian's 22.05), which a 25.11 slurmctld answers "Insane message length".
        self.ctl = self.cluster.control()
        self._log(f"cluster up: {len(info.nodes)} nodes + {len(info.spares)} spares "
                  f"in {self.up_s:.1f} s")  # fmt: skip
        if self.opts.jobs:
            began = time.monotonic()
            self._run_jobs(info.nodes)
            self.jobs_s = time.monotonic() - began
            self._log(f"{len(info.nodes)} jobs running after {self.jobs_s:.1f} s")
        self.memory_mb = resident_mb(procs.cluster_processes(str(self.state)))
        self._log(f"the cluster's processes hold {self.memory_mb:.0f} MiB")
        self.endpoint = self._start_coordinator()
        self._log(f"coordinator at {self.endpoint.url}")

    def _run_jobs(self, nodes: tuple[str, ...]) -> None:
        argv = ["sbatch", "--parsable", "--requeue", "--job-name", "storm", "--nodes", "1",
                "--output", "/dev/null", *JOB]  # fmt: skip
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _n: self.ctl.run(argv), nodes))

        def running() -> bool:
            busy = {n for j in self.ctl.jobs() if j.state == "RUNNING" for n in j.nodes}
            return busy >= set(nodes)

        wait_for(running, self.opts.up_timeout_s, "a job running on every node")

    def _shim_sees_calls(self) -> bool:
        return self.opts.backend == "cli" and self.cluster.install.prefix is None

    def _start_coordinator(self) -> Endpoint:
        # As service.bringup.start_coordinator starts it, with the backend asked for and an
        # scontrol on PATH that logs each call (to count the coordinator's updates).
        shim_dir = self.root / "shim"
        shim_dir.mkdir(exist_ok=True)
        # The cluster's own scontrol (a built 25.11's, else Debian's on PATH).
        path = install.command_env(self.cluster.install, os.environ).get("PATH")
        real = shutil.which("scontrol", path=path)
        if real is None:
            raise UsageError(f"no scontrol for {self.cluster.install.describe()}")
        shim = shim_dir / "scontrol"
        shim.write_text(SHIM.format(log=self.root / "scontrol.log", real=real))
        shim.chmod(0o755)
        env = {**os.environ, "PATH": f"{shim_dir}:{os.environ.get('PATH', '')}"}
        policy = self.root / "policy.yaml"
        policy.write_text(
            f"# The breaker lifted above the storm: every faulted node is taken out.\n"
            f"breaker: {{max_nodes: {self.opts.faulted + 1}, max_fraction: 1.0}}\n"
        )
        endpoint = coordinator_proc.start(
            self.coord_dir,
            slurm_conf=self.cluster.conf_path,
            config=policy,
            listen="127.0.0.1:0",
            extra_args=self._backend_args(),
            env=env,
            timeout_s=max(30.0, self.opts.nodes / 4),
        )
        client = Client(endpoint.url, admin_token(endpoint.tokens_path))
        every = set(self.ctl_names())
        wait_for(
            lambda: {n["name"] for n in client.get("/v1/nodes")} >= every,
            60,
            "the coordinator's first read of every node",
        )
        return endpoint

    def _backend_args(self) -> tuple[str, ...]:
        args: tuple[str, ...] = ("--slurm-backend", self.opts.backend)
        if self.opts.backend != "rest":
            return args
        rest = self.cluster.start_rest()
        # Asked of the daemon itself: which API version it speaks decides what it can do.
        probe = rest_slurm.connect(url=rest.url, token_file=rest.token_file, user=rest.user)
        probe.close()
        if "down_many" in probe.unsupported:
            raise UsageError(
                "the rest backend cannot set nodes DOWN on this Slurm (its slurmrestd has no "
                "node update; Slurm 25.11's has); use --backend cli"
            )
        return (*args, "--slurmrestd", rest.url, "--slurm-jwt-file", str(rest.token_file),
                "--slurm-user", rest.user)  # fmt: skip

    def ctl_names(self) -> list[str]:
        """Every node of the cluster, spares last."""
        info = self.cluster.info()
        assert info is not None
        return list(info.nodes + info.spares)

    def spares(self) -> list[str]:
        """The cluster's spares."""
        info = self.cluster.info()
        assert info is not None
        return list(info.spares)

    def start_agents(self, nodes: list[str]) -> None:
        """A real agent on each of ``nodes``, connected before this returns."""
        if nodes and self.endpoint is not None:
            self.agent_pids = bringup.start_agents(self.state, self.endpoint, nodes)
            self._log(f"agents on {', '.join(nodes)}")

    # --- the storm --------------------------------------------------------------------------

    def choose(self) -> tuple[list[str], list[str]]:
        """The faulted nodes (seeded), and which of them report through a real agent."""
        info = self.cluster.info()
        assert info is not None
        chosen = random.Random(self.opts.seed).sample(list(info.nodes), self.opts.faulted)
        return chosen, sorted(chosen[: self.opts.agents])

    def storm(self) -> StormResult:
        """Start the agents, fail the chosen nodes at once, wait for every DOWN (and the
        coordinator's records of it, and the spares' promotions), and read back what
        happened."""
        assert self.endpoint is not None, "start() first"
        faulted, via_agent = self.choose()
        self.start_agents(via_agent)
        before_nodes, before_jobs = self._snapshot()
        log = self.state / "log" / "slurmctld.log"
        offset = log_size(log)
        load = load_average()
        fault_at, answers = self._fire(self.endpoint, faulted, via_agent)
        deadline = time.monotonic() + self.opts.deadline_s
        # The log first, polled often (a file); the coordinator's records then, seldom, so
        # that reading them does not slow down what is measured.
        wait_until(lambda: set(faulted) <= set(logged_downs(log, offset)), deadline)
        downs = logged_downs(log, offset)
        incidents = self._incidents_once_recorded(faulted, deadline)
        taken, missing = incident_latencies(incidents, faulted)
        after_nodes, after_jobs = self._snapshot()
        calls = update_calls(self.root / "scontrol.log")
        problems = healthy_changes(
            before_nodes,
            after_nodes,
            before_jobs,
            after_jobs,
            faulted=set(faulted),
            fault=FAULT,
            log_text=log_text(log, offset),
            calls=calls,
            spares=set(self.spares()),
        )
        problems += [f"{n}: no take-down recorded by the coordinator" for n in missing]
        return StormResult(
            options=asdict(self.opts),
            faulted=sorted(faulted),
            via_agent=via_agent,
            fault_to_down=summary([downs[n] - fault_at for n in faulted if n in downs]),
            down_s=sorted(round(downs[n] - fault_at, 4) for n in faulted if n in downs),
            receipt_to_takedown=summary(taken),
            post_answered=summary([at - fault_at for _, at in answers.values()]),
            promoted=summary(at - fault_at for at in promotions(incidents).values()),
            not_down=sorted(set(faulted) - set(downs)),
            problems=problems,
            stages=stages(incidents, fault_at, calls, downs, faulted),
            # The shim sees the cli backend's calls on Debian's Slurm only: a built install's
            # programs come first on the coordinator's PATH (slurm.install.command_env).
            updates=[c for _, c in calls] if self._shim_sees_calls() else None,
            slurm=self.ctl.run(["scontrol", "--version"]).strip(),
            up_s=self.up_s,
            jobs_s=self.jobs_s,
            memory_mb=self.memory_mb,
            load=load,
        )

    def _fire(
        self, endpoint: Endpoint, faulted: list[str], via_agent: list[str]
    ) -> tuple[float, dict[str, tuple[int, float]]]:
        tokens = load_tokens(self.coord_dir / TOKENS_FILE).node_tokens
        posted = [n for n in faulted if n not in via_agent]
        fault_at, answers = asyncio.run(
            send_events(
                endpoint.url,
                posted,
                {n: tokens[n] for n in posted},
                kmsg={n: agents_proc.kmsg_file(self.coord_dir, n) for n in via_agent},
                fault=FAULT,
            )
        )
        bad = sorted({code for code, _ in answers.values()} - {200})
        if bad:
            raise UsageError(f"the intake refused events: status codes {bad}")
        return fault_at, answers

    def _incidents_once_recorded(self, faulted: list[str], deadline: float) -> list[dict[str, Any]]:
        """The coordinator's incidents once every take-down is recorded and every spare
        that can be promoted is (or at the deadline)."""
        assert self.endpoint is not None
        client = Client(self.endpoint.url, admin_token(self.endpoint.tokens_path))
        want = min(len(self.spares()), len(faulted))
        incidents: list[dict[str, Any]] = []

        def recorded() -> bool:
            incidents[:] = client.get("/v1/incidents")
            done = not incident_latencies(incidents, faulted)[1]
            return done and len(promotions(incidents)) >= want

        wait_until(recorded, deadline, every_s=0.5)
        return incidents

    def _snapshot(self) -> tuple[dict[str, NodeInfo], dict[str, list[JobInfo]]]:
        ctl: SlurmControl = self.ctl
        nodes = {n.name: n for n in ctl.nodes()}
        jobs: dict[str, list[JobInfo]] = {}
        for j in ctl.jobs():
            if j.state == "RUNNING":
                for n in j.nodes:
                    jobs.setdefault(n, []).append(j)
        return nodes, jobs

    # --- stop -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the agents, the coordinator and the cluster, each by pid; then record in
        :attr:`leftovers` any of their processes still there."""
        coordinator_pid = self.endpoint.pid if self.endpoint else None
        bringup.down(self.state)
        left = [f"agent:{n} pid {p}" for n, p in self.agent_pids.items() if proc.alive(p)]
        if coordinator_pid is not None and proc.alive(coordinator_pid):
            left.append(f"coordinator pid {coordinator_pid}")
        left += [f"pid {p}" for p in sorted(procs.cluster_processes(str(self.state)))]
        self.leftovers = left


def wait_until(done: Callable[[], bool], deadline: float, every_s: float = 0.05) -> bool:
    """Poll ``done`` until it holds or ``deadline`` (monotonic seconds) passes."""
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def wait_for(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """:func:`wait_until`, raising TimeoutError naming ``what`` after ``timeout_s`` seconds."""
    if not wait_until(done, time.monotonic() + timeout_s, every_s=0.2):
        raise TimeoutError(f"no {what} within {timeout_s:g} s")
