"""The job supervisor's view of Slurm from inside its own job (:class:`JobSlurm` of
:mod:`recovery.inalloc.supervisor`): the job's nodes, their state, giving nodes back, and the
training step launched with ``srun``.

Runs in the batch step, so it uses the job's own ``SLURM_JOB_ID`` and ``SLURM_CONF``. The step
is ``srun --nodes=K --ntasks=K --ntasks-per-node=1 --nodelist=...`` with
``RECOVER_RENDEZVOUS=<NodeAddr of the first node>:<port>``; the port is one free on the batch
host, which on the local cluster (every node on one host) is free for process 0 too. On a
real cluster a port taken on process 0's node makes the step fail to join (exit 11), which
the supervisor treats as a failed step with no lost node: the job ends and is resubmitted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence

from recovery.multiproc import ENV_RENDEZVOUS, free_port
from slurm.cli_slurm import CliSlurm

#: `recover train --memory-every` as the environment gives it (recovery.train.memory).
ENV_MEMORY_EVERY = "RECOVER_MEMORY_EVERY"


class SrunStep:
    """A running ``srun`` step."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def wait(self) -> int:
        """The step's exit status; 128+n when srun itself died of signal n."""
        rc = self.proc.wait()
        return rc if rc >= 0 else 128 - rc

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            self.proc.send_signal(signum)


class JobSteps:
    """Slurm as the supervisor of job ``job_id`` sees it, through Slurm's commands."""

    def __init__(self, control: CliSlurm, job_id: str, env: Mapping[str, str] | None = None):
        self.control = control
        self.job_id = job_id
        self.env = dict(os.environ if env is None else env)

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
        self.control.run(
            ["scontrol", "update", f"JobId={self.job_id}", f"NodeList={','.join(keep)}"]
        )

    def node_addr(self, node: str) -> str:
        out = self.control.run(["scontrol", "show", "node", "-o", node])
        for word in out.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
        return node

    def launch(self, nodes: Sequence[str], command: Sequence[str]) -> SrunStep:
        k = len(nodes)
        env = dict(self.env)
        env[ENV_RENDEZVOUS] = f"{self.node_addr(nodes[0])}:{free_port()}"
        # A relaunch restores from a survivor's memory: keep a copy every step unless the
        # job says otherwise (recover train --memory-every, recovery.train.memory).
        env.setdefault(ENV_MEMORY_EVERY, "1")
        argv = [
            "srun",
            f"--nodes={k}",
            f"--ntasks={k}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}",
            "--kill-on-bad-exit=1",
            *command,
        ]
        return SrunStep(subprocess.Popen(argv, env=env))
