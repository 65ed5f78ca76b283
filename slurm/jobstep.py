"""The job supervisor's view of Slurm from inside its own job (:class:`JobSlurm` of
:mod:`recovery.inalloc.supervisor`): the job's nodes, their state, giving nodes back, its time
left, and the training launched with ``srun``.

Runs in the batch step, so it uses the job's own ``SLURM_JOB_ID`` and ``SLURM_CONF``. A launch
of K processes is told ``RECOVER_RENDEZVOUS=<NodeAddr of the first node>:<port>``; the port is
one free on the batch host, which on the local cluster (every node on one host) is free for
process 0 too. On a real cluster a port taken on process 0's node makes the launch fail to
join (exit 11), which the supervisor treats as a failed step with no lost node: the job ends
and is resubmitted.

Each process of a launch is its own one-node step (``srun --nodes=1 --overlap``), started as a
standby (``RECOVER_STANDBY=1``, :mod:`recovery.train.standby`): it imports what training needs
and waits for its rank on stdin. :meth:`JobSteps.warm` starts one on every node of the job
while the training runs, so a relaunch hands the survivors' nodes and the spare a process that
is already up instead of starting srun, the interpreter and JAX on the critical path; a node
with no standby gets one started at the launch and assigned at once (the same path, cold).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from recovery.contract.exits import signal_status
from recovery.contract.standby import ENV_STANDBY
from recovery.inalloc.decide import ended_cleanly, launch_status
from recovery.multiproc import (
    ENV_GROUP,
    ENV_PROCESS_ID,
    ENV_PROCESSES,
    ENV_RENDEZVOUS,
    free_port,
)
from recovery.ports.checks import BurnInOutcome
from slurm.burnin import judge
from slurm.cli_slurm import CliSlurm

#: `recover train --memory-every` as the environment gives it (recovery.api.memory).
ENV_MEMORY_EVERY = "RECOVER_MEMORY_EVERY"
#: Seconds the other processes of a launch get to end by themselves once one failed (a
#: process that loses a peer stops within a second), before their steps are ended.
KILL_AFTER_S = 10.0
#: Seconds a standby gets to exit after its input is closed.
STANDBY_EXIT_S = 5.0
#: How often a launch's processes are looked at while waiting (seconds).
POLL_S = 0.05


def _status(returncode: int) -> int:
    """An exit status as a shell reports it: 128+n for a process killed by signal n."""
    return returncode if returncode >= 0 else signal_status(-returncode)


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` (``[days-][hours:]minutes:seconds``); None for anything
    else (``UNLIMITED``, ``NOT_SET``, ``INVALID``, nothing)."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    if days and not days.isdigit():
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(seconds + int(days or 0) * 86400)


class LaunchStep:
    """One launch of the training: a one-node ``srun`` step per process."""

    def __init__(
        self,
        procs: Sequence[subprocess.Popen[bytes]],
        nodes: Sequence[str],
        warm: Sequence[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.procs = list(procs)
        self.nodes = list(nodes)
        self.warm = list(warm)
        """The nodes whose process was already up (a standby) when the launch came."""
        self.pid = self.procs[0].pid
        self._clock = clock
        self._sleep = sleep
        self._ended: dict[int, int] = {}
        self._order: list[int] = []
        self._failed_at: float | None = None
        self._ending = False

    def wait(self, timeout: float | None = None) -> int | None:
        """The launch's status (:func:`~recovery.inalloc.decide.launch_status`) once every
        process ended; None if ``timeout`` seconds pass first. Once one failed, the others get
        :data:`KILL_AFTER_S` to end by themselves before their steps are ended."""
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            for i, proc in enumerate(self.procs):
                if i in self._ended:
                    continue
                rc = proc.poll()
                if rc is None:
                    continue
                self._ended[i] = _status(rc)
                self._order.append(i)
                if not ended_cleanly(self._ended[i]) and self._failed_at is None:
                    self._failed_at = self._clock()
            if len(self._ended) == len(self.procs):
                return launch_status([self._ended[i] for i in self._order])
            if (
                not self._ending
                and self._failed_at is not None
                and self._clock() - self._failed_at >= KILL_AFTER_S
            ):
                self._end_the_rest()
            if deadline is not None and self._clock() >= deadline:
                return None
            self._sleep(POLL_S)

    def _end_the_rest(self) -> None:
        """srun ends its step on SIGINT (``--quit-on-interrupt``): SIGKILL to the task."""
        self._ending = True
        for i, proc in enumerate(self.procs):
            if i not in self._ended:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)

    def end(self) -> None:
        """End every process now (the supervisor's verdict: the launch stopped making
        progress); a stopped or stuck task is SIGKILLed all the same."""
        self._end_the_rest()

    def signal(self, signum: int) -> None:
        """Forward ``signum`` to every process (each srun passes it to its task)."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    proc.send_signal(signum)


class JobSteps:
    """Slurm as the supervisor of job ``job_id`` sees it, through Slurm's commands."""

    def __init__(self, control: CliSlurm, job_id: str, env: Mapping[str, str] | None = None):
        self.control = control
        self.job_id = job_id
        self.env = dict(os.environ if env is None else env)
        self._standby: dict[str, subprocess.Popen[bytes]] = {}
        self._launches = itertools.count(1)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobSteps:
        """For the job this process runs in (``SLURM_JOB_ID``; ``SLURM_CONF`` if set)."""
        environ = dict(os.environ if env is None else env)
        job_id = environ.get("SLURM_JOB_ID")
        if not job_id:
            raise RuntimeError("SLURM_JOB_ID is not set: the supervisor runs inside a job")
        conf = environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
        return cls(CliSlurm(conf, env=environ), job_id, environ)

    def job_nodes(self) -> list[str]:
        out = self.control.run(["scontrol", "show", "job", "-o", self.job_id])
        nodelist = ""
        for word in out.split():
            if word.startswith("NodeList="):
                nodelist = word.split("=", 1)[1]
        if not nodelist or nodelist == "(null)":
            return []
        return self.control.run(["scontrol", "show", "hostnames", nodelist]).split()

    def bad_nodes(self, nodes: Sequence[str]) -> list[str]:
        wanted = set(nodes)
        bad = []
        for node in self.control.nodes():
            if node.name not in wanted:
                continue
            flags = node.flags
            if node.down or node.drained or "NOT_RESPONDING" in flags or "FAIL" in node.state:
                bad.append(node.name)
        return bad

    def release(self, keep: Sequence[str]) -> None:
        self._end_standbys([n for n in self._standby if n not in keep])
        self.control.run(
            ["scontrol", "update", f"JobId={self.job_id}", f"NodeList={','.join(keep)}"]
        )

    def time_left(self) -> float | None:
        """Seconds before the job's time limit (``squeue %L``); None: unlimited or unknown."""
        out = self.control.run(["squeue", "-h", "-j", self.job_id, "-o", "%L"]).strip()
        return parse_time_left(out)

    def node_addr(self, node: str) -> str:
        out = self.control.run(["scontrol", "show", "node", "-o", node])
        for word in out.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
        return node

    def hold(self, node: str, reason: str) -> None:
        """Take ``node`` out of service with ``reason`` (a drain: it leaves the job when
        released). Raises RecoverError when Slurm refuses (a user who is not an operator)."""
        self.control.run(
            ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
        )

    def burn_in(
        self,
        node: str,
        budget_s: float,
        *,
        expect_devices: int = 0,
        peer: str | None = None,
        python: str = sys.executable,
    ) -> BurnInOutcome:
        """The burn-in of ``node``, a spare of this job, as a step of it (``python -m
        recovery.train.burnin``, beside the node's standby): one process on ``node`` and one
        on ``peer`` (a healthy node of the job: the collective crosses the network), or both
        on ``node``. Past ``budget_s`` the step is ended: failed. Never raises for what the
        node did."""
        start = time.monotonic()
        nodes = [node] if peer is None else [node, peer]
        # Process 0 runs on the first of the step's nodes in Slurm's order.
        ordered = self.control.run(["scontrol", "show", "hostlistsorted", ",".join(nodes)])
        first = self.control.run(["scontrol", "show", "hostnames", ordered.strip()]).split()
        env = dict(self.env)
        env[ENV_RENDEZVOUS] = f"{self.node_addr(first[0] if first else node)}:{free_port()}"
        for name in (ENV_STANDBY, ENV_PROCESS_ID, ENV_PROCESSES, ENV_GROUP):
            env.pop(name, None)
        spread = ["--overcommit"] if peer is None else ["--ntasks-per-node=1"]
        argv = [
            "srun", f"--nodes={len(nodes)}", "--ntasks=2", f"--nodelist={','.join(nodes)}",
            "--overlap", *spread, "--kill-on-bad-exit=1", "--quit-on-interrupt",
            python, "-m", "recovery.train.burnin", "--processes", "2",
            "--timeout", str(max(5, int(budget_s))), "--expect-devices", str(expect_devices),
        ]  # fmt: skip
        processes = 2
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = proc.communicate(timeout=budget_s)
        except subprocess.TimeoutExpired:
            # srun --quit-on-interrupt ends the step on SIGINT (a SIGKILLed srun would leave
            # its tasks running on the node).
            proc.send_signal(signal.SIGINT)
            try:
                out, _ = proc.communicate(timeout=STANDBY_EXIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            said = judge(out or "", ok=False, exit_code=0, processes=processes).detail
            return BurnInOutcome(
                False, f"did not finish within {budget_s:g} s ({said}); ended",
                took_s=time.monotonic() - start,
            )  # fmt: skip
        status = proc.returncode
        found = judge(out, ok=status == 0, exit_code=status, processes=processes)
        if not found.ok and found.detail == "no output":
            found = BurnInOutcome(False, (err.strip().splitlines() or ["no output"])[-1])
        ended = "" if found.ok else f" (status {status})"
        if peer is not None:
            found = BurnInOutcome(found.ok, f"{found.detail}, one on {node} and one on {peer}")
        return BurnInOutcome(found.ok, f"step{ended}: {found.detail}",
                             took_s=time.monotonic() - start)  # fmt: skip

    def _start_standby(self, node: str, command: Sequence[str]) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        env[ENV_STANDBY] = "1"
        # A relaunch restores from a survivor's memory: keep a copy every step unless the
        # job says otherwise (recover train --memory-every, recovery.api.memory).
        env.setdefault(ENV_MEMORY_EVERY, "1")
        argv = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--overlap",  # beside the process it may replace
            "--quit-on-interrupt",
            *command,
        ]
        return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE)

    def warm(self, nodes: Sequence[str], command: Sequence[str]) -> list[str]:
        """Start a standby on each of ``nodes`` that has none alive; the nodes started."""
        started = []
        for node in nodes:
            proc = self._standby.get(node)
            if proc is not None and proc.poll() is None:
                continue
            self._standby[node] = self._start_standby(node, command)
            started.append(node)
        return started

    def launch(self, nodes: Sequence[str], command: Sequence[str]) -> LaunchStep:
        """Assign process r of a new launch to ``nodes[r]``: the node's standby if one is
        alive, else one started now."""
        k = len(nodes)
        rendezvous = f"{self.node_addr(nodes[0])}:{free_port()}"
        group = f"{self.job_id}.launch{next(self._launches)}"
        procs, warm = [], []
        for rank, node in enumerate(nodes):
            proc = self._standby.pop(node, None)
            if proc is not None and proc.poll() is None:
                warm.append(node)
            else:
                proc = self._start_standby(node, command)
            assignment = {
                ENV_PROCESS_ID: str(rank),
                ENV_PROCESSES: str(k),
                ENV_RENDEZVOUS: rendezvous,
                ENV_GROUP: group,
            }
            assert proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(assignment) + "\n").encode())
                proc.stdin.close()
            except BrokenPipeError:  # it died just now: its status ends the launch
                pass
            procs.append(proc)
        return LaunchStep(procs, nodes, warm)

    def close(self) -> None:
        """End every standby (the job is over)."""
        self._end_standbys(list(self._standby))

    def _end_standbys(self, nodes: Sequence[str]) -> None:
        procs = [p for n in nodes if (p := self._standby.pop(n, None)) is not None]
        for proc in procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # end of input: the standby exits 0
        deadline = time.monotonic() + STANDBY_EXIT_S
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STANDBY_EXIT_S)
