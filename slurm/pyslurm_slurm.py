"""``PySlurm``: the :class:`recovery.ports.slurm.SlurmControl` port over pyslurm (Slurm 25.11).

pyslurm wraps libslurm, so a read or a node update is one RPC to slurmctld from this process
instead of a ``scontrol`` process: tens of times more calls per second (benchmarks/README.md).
PyPI only has pyslurm for Slurm 25.11 (25.11.x, built from its sdist against a 25.11 install:
``SLURM_INCLUDE_DIR``/``SLURM_LIB_DIR``; ``scripts/setup.sh`` does it when the build exists).

What goes through pyslurm: node and job reads, node DOWN/DRAIN/RESUME (a group of nodes in one
update), signals (to the batch shell only, as the CLI backend's ``scancel --batch``), requeue,
release and cancel. Submission stays with ``sbatch`` (inherited from :class:`CliSlurm`):
pyslurm's job description has no ``--requeue=expedite`` and no batch-only ``--signal=B:``,
and a submission is no hot path.

Limits, by design of libslurm:

* **One cluster per process.** libslurm reads ``SLURM_CONF`` once, when first used; a second
  ``PySlurm`` for another conf in the same process is refused (UsageError).
* **Slurm 25.11 only.** libslurm 25.11 speaks 25.11's protocol (and two releases back); a
  22.05 slurmctld drops its requests, so a conf naming another install is refused.
* **The GIL is held while waiting on slurmctld.** pyslurm's calls do not release it, so a
  slurmctld that hangs stalls every thread of this process (a coordinator's HTTP intake
  included) for up to libslurm's ``MessageTimeout``; the CLI backend waits in a child
  process and does not have this problem.

Errors: pyslurm's RPCError carries Slurm's errno; those meaning slurmctld was not reached are
SlurmUnavailableError (transient), the rest SlurmRefusedError. The rules around every request
(idempotence, ownership, re-reads after a refusal) are :class:`slurm.control.SlurmBase`'s.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from recovery.errors import SlurmRefusedError, SlurmUnavailableError, UsageError
from recovery.ports.slurm import JobInfo, NodeInfo
from slurm import install
from slurm.cli_slurm import CliSlurm
from slurm.parse import UNREACHABLE, expand_hostlist, job_state_word, parse_jobs, split_state
from slurm.rest_parse import UNREACHABLE_ERRNOS

T = TypeVar("T")

#: The conf the pyslurm of this process serves (libslurm reads it once).
_bound: Path | None = None
_module: ModuleType | None = None


def unavailable(env: Mapping[str, str] | None = None) -> str | None:
    """Why the pyslurm backend cannot be used here, or None when it can: the 25.11 build is
    missing, or pyslurm is not installed (``scripts/setup.sh`` builds it against the build)."""
    built = install.build(env)
    if built is None:
        return f"Slurm 25.11 is not built; {install.BUILD_HINT}"
    # Not imported here: libslurm reads SLURM_CONF when pyslurm is imported, and exits the
    # process when there is none (see _bind).
    if importlib.util.find_spec("pyslurm") is None:
        return (
            "pyslurm is not installed; build it against Slurm 25.11 with "
            f"SLURM_INCLUDE_DIR={built.prefix}/include SLURM_LIB_DIR={built.prefix}/lib "
            "pip install pyslurm==25.11.2 (./scripts/setup.sh does)"
        )
    return None


def _load() -> ModuleType:
    """Import pyslurm (its extension finds the build's libslurmfull through the run path its
    build recorded)."""
    global _module
    if _module is None:
        # Imported by name: pyslurm ships no type information, and its absence is a reason
        # this backend reports (unavailable()), not an error at import time.
        _module = importlib.import_module("pyslurm")
    return _module


def _bind(conf: Path) -> ModuleType:
    """pyslurm, serving ``conf``; UsageError when this process already serves another."""
    global _bound
    inst = install.of_conf(conf)
    if inst is not None and inst.series < (25, 11):
        raise UsageError(
            f"the pyslurm backend needs Slurm 25.11; {conf} names {inst.describe()} (use "
            "--slurm-backend cli, or a cluster on 25.11: recover cluster up --slurm 25.11)"
        )
    why = unavailable()
    if why is not None:
        raise UsageError(f"the pyslurm backend is not available: {why}")
    if _bound is not None and _bound != conf:
        raise UsageError(
            f"pyslurm in this process already serves {_bound}; libslurm reads one slurm.conf "
            "per process (use the CLI backend for a second cluster)"
        )
    if _bound is None:
        # libslurm reads SLURM_CONF when pyslurm is imported (and dies without one); every
        # pyslurm call of this process uses it.
        os.environ["SLURM_CONF"] = str(conf)
        _bound = conf
    return _load()


class PySlurm(CliSlurm):
    """SlurmControl through pyslurm for the cluster of ``conf_path`` (submission through
    ``sbatch``, see the module docstring). ``env`` is the environment of those commands and
    of submitted jobs. Raises UsageError when pyslurm is not available, the conf names a
    Slurm older than 25.11, or this process already serves another conf."""

    def __init__(
        self,
        conf_path: str | Path,
        *,
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(conf_path, timeout_s=timeout_s, env=env)
        self._ps = _bind(Path(conf_path).absolute())
        # (job id, restart count) of a finished run -> its (exit status, signal) as squeue
        # read it; a run's status never changes once it ended.
        self._ended_status: dict[tuple[str, int], tuple[int | None, int | None]] = {}

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one pyslurm call; its RPCError becomes our error (see the module docstring)."""
        try:
            return fn()
        except self._ps.RPCError as e:
            errno = getattr(e, "errno", None)
            msg = f"pyslurm {what}: {e}"
            if errno in UNREACHABLE_ERRNOS or UNREACHABLE.search(str(e)):
                raise SlurmUnavailableError(msg, delay=1.0) from e
            raise SlurmRefusedError(msg) from e

    # --- reading --------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """All nodes, sorted by name (one ``slurm_load_node`` and partitions RPC)."""
        loaded = self._call("load nodes", self._ps.Nodes.load)
        out = [_node(n) for n in loaded.values()]
        return sorted(out, key=lambda n: n.name)

    def jobs(self) -> list[JobInfo]:
        """All jobs slurmctld remembers, finished ones within MinJobAge included.

        pyslurm folds an exit status of 128 or more into a smaller one (a shell passing on
        SIGABRT's 134 reads as 6), so a finished job's status comes from ``squeue --json``
        once per run (one command for all the new ones), then from memory."""
        loaded = self._call("load jobs", self._ps.Jobs.load)
        jobs = sorted((_job(j) for j in loaded.values()), key=lambda j: int(j.job_id))
        fresh = [j.job_id for j in jobs if j.finished and _run(j) not in self._ended_status]
        if fresh:
            for j in parse_jobs(
                self.read_json(["squeue", "--json", "--states=all", f"--jobs={','.join(fresh)}"])
            ):
                if j.finished:
                    self._ended_status[_run(j)] = (j.exit_code, j.signal)
        return [
            replace(
                j, exit_code=self._ended_status[_run(j)][0], signal=self._ended_status[_run(j)][1]
            )
            if j.finished and _run(j) in self._ended_status
            else j
            for j in jobs
        ]

    # --- raw requests ---------------------------------------------------------------------

    def _request_update(self, nodes: Sequence[str], state: str, reason: str) -> None:
        ps = self._ps
        # One update RPC for the whole group (pyslurm joins the names into a hostlist).
        group = ps.Nodes(list(nodes))
        self._call(
            f"{state} {','.join(nodes)}", lambda: group.modify(ps.Node(state=state, reason=reason))
        )

    def _request_resume(self, node: str) -> None:
        ps = self._ps
        self._call(f"resume {node}", lambda: ps.Node(node).modify(ps.Node(state="RESUME")))

    def _request_signal(self, job_id: str, signal: str) -> None:
        # The batch shell only, as `scancel --batch`: the wrapper forwards it to training.
        job = self._ps.Job(int(job_id))
        # pyslurm takes a number or a full name (SIGUSR1), not Slurm's short one (USR1).
        sig: int | str = int(signal) if signal.isdigit() else f"SIG{signal.removeprefix('SIG')}"
        self._call(f"signal {signal} to job {job_id}", lambda: job.send_signal(sig, steps="batch"))

    def _request_requeue(self, job_id: str) -> None:
        job = self._ps.Job(int(job_id))
        self._call(f"requeue job {job_id}", job.requeue)

    def _request_release(self, job_id: str) -> None:
        job = self._ps.Job(int(job_id))
        self._call(f"release job {job_id}", job.release)

    def _request_cancel(self, job_id: str) -> None:
        job = self._ps.Job(int(job_id))
        self._call(f"cancel job {job_id}", job.cancel)


def _node(n: Any) -> NodeInfo:
    # pyslurm's state is Slurm's own "IDLE+DRAIN" text; the reason stays while the node is in
    # service again (as 25.11's JSON), so it is kept only while the node is out.
    state, flags = split_state(n.state or "UNKNOWN")
    out = state == "DOWN" or "DRAIN" in flags
    return NodeInfo(
        name=str(n.name),
        state=state,
        flags=flags,
        reason=str(n.reason or "") if out else "",
        reason_set_by=str(n.reason_user or "") if out else "",
        cpus=int(n.total_cpus or 0),
        partitions=tuple(str(p) for p in n.partitions or ()),
        features=frozenset(str(f) for f in n.active_features or ()),
        reason_changed_at=float(n.reason_time or 0) if out else 0.0,
    )


def _run(job: JobInfo) -> tuple[str, int]:
    return job.job_id, job.restart_count


def _job(j: Any) -> JobInfo:
    # pyslurm's state is Slurm's job_state_string: a flag's name when one is set.
    state, flags = job_state_word(str(j.state or ""))
    nodes = j.allocated_nodes or ""
    job = JobInfo(
        job_id=str(j.id),
        name=str(j.name or ""),
        state=state,
        nodes=expand_hostlist(nodes) if nodes and state != "PENDING" else (),
        restart_count=int(j.requeue_count or 0),
        reason=str(j.state_reason or ""),
        exit_code=j.exit_code,
        flags=flags,
        signal=int(j.exit_code_signal or 0) or None,
        requeueable=bool(j.is_requeueable) if j.is_requeueable is not None else True,
        batch_host=str(getattr(j, "batch_host", "") or ""),
        comment=str(getattr(j, "comment", "") or ""),
    )
    if job.finished:
        # A live job's end_time is Slurm's projection (start + time limit).
        job = replace(job, end_time=float(j.end_time or 0))
    return job
