"""``CliSlurm``: the :class:`recovery.ports.slurm.SlurmControl` port over Slurm's CLI tools.

Every command runs as an argv list (never through a shell) with ``SLURM_CONF`` in its
environment. Works with every Slurm version the project meets (22.05 and newer); see
``slurm.parse`` for the JSON shapes.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recovery.errors import (
    ReasonNotOursError,
    SlurmError,
    SlurmNotInstalledError,
    SlurmRefusedError,
    SlurmUnavailableError,
    UsageError,
    unknown_choice,
)
from recovery.ports.slurm import (
    BatchJob,
    JobInfo,
    NodeInfo,
    mark,
    validate_job_id,
    validate_node_name,
)
from slurm.parse import parse_jobs, parse_nodes, reply_errors

INSTALL_HINT = "install them with `apt-get install -y slurm-wlm munge` (or `./scripts/setup.sh`)"

# Text in stderr meaning slurmctld could not be reached: worth retrying later.
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|timed out|Socket timed out"
    r"|Zero Bytes were transmitted|Communication connection failure|Unable to connect"
    r"|Could not establish a configuration source|Slurm backup controller in standby",
    re.IGNORECASE,
)
_ALREADY_REQUEUED = re.compile(r"Job is pending execution", re.IGNORECASE)


def classify_failure(argv: Sequence[str], returncode: int, stderr: str) -> SlurmError | Exception:
    """Map a failed Slurm command to our errors: unreachable -> SlurmUnavailableError
    (transient), anything else -> SlurmRefusedError (a verdict). Pure; used by CliSlurm."""
    cmd = " ".join(argv[:3])
    msg = stderr.strip() or f"exit status {returncode}"
    if _UNREACHABLE.search(stderr):
        return SlurmUnavailableError(f"{cmd}: slurmctld unreachable: {msg}", delay=1.0)
    return SlurmRefusedError(f"{cmd}: refused: {msg}")


def classify_reply_errors(
    argv: Sequence[str], errors: list[dict[str, Any]]
) -> SlurmError | Exception:
    """Map the ``errors`` of a ``sinfo/squeue --json`` reply to our errors. Pure.

    Slurm 22.05 exits 0 and reports ``{"error": "Unspecified error", "errno": -1}`` when it
    cannot reach slurmctld, so errno -1 (or a connection message) is SlurmUnavailableError;
    anything else is a SlurmRefusedError.
    """
    cmd = " ".join(argv[:2])
    text = "; ".join(f"{e.get('error', '?')} (errno {e.get('errno', '?')})" for e in errors)
    if any(e.get("errno") == -1 or _UNREACHABLE.search(str(e.get("error", ""))) for e in errors):
        return SlurmUnavailableError(f"{cmd}: slurmctld unreachable: {text}", delay=1.0)
    return SlurmRefusedError(f"{cmd}: refused: {text}")


def take_out_reason(info: NodeInfo, state: str, text: str) -> str | None:
    """The reason to write when taking ``info`` out with ``state`` (DOWN or DRAIN) and our
    marked reason ``text``; None when there is nothing to do. Pure; used by CliSlurm.

    A node held by someone else (:attr:`NodeInfo.held_by_other`) keeps their reason: DOWN
    already, or asked to DRAIN, is a no-op; drained by them and asked DOWN, it goes DOWN with
    their reason, so our resume (which only undoes our marks) never puts it back. A node
    already in ``state`` with ``text`` is a no-op; anything else (in service, ours with
    another reason, or out with Slurm's own mark, :func:`is_slurms_own`) gets ``text``.
    """
    if info.held_by_other:
        return None if info.down or state == "DRAIN" else info.reason
    held = info.down if state == "DOWN" else info.drained
    return None if held and info.reason == text else text


class CliSlurm:
    """SlurmControl through ``scontrol``, ``sinfo``, ``squeue``, ``sbatch`` and ``scancel``.

    ``conf_path`` is the slurm.conf every command is pointed at (``SLURM_CONF``); ``timeout_s``
    bounds each command in seconds (a timeout is a SlurmUnavailableError).
    """

    def __init__(
        self,
        conf_path: str | Path,
        *,
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.conf_path = Path(conf_path)
        self.timeout_s = timeout_s
        base = dict(os.environ if env is None else env)
        base["SLURM_CONF"] = str(self.conf_path)
        self._env = base

    # --- transport ----------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, stdin: str | None = None) -> str:
        """Run one Slurm command; return its stdout.

        Raises SlurmNotInstalledError when the program is missing, SlurmUnavailableError when
        slurmctld is unreachable or the command ran past ``timeout_s``, SlurmRefusedError when
        Slurm refused.
        """
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError as e:
            raise SlurmNotInstalledError(f"{argv[0]} not found; {INSTALL_HINT}") from e
        except subprocess.TimeoutExpired as e:
            raise SlurmUnavailableError(
                f"{' '.join(argv[:3])}: no answer within {self.timeout_s:g} s"
            ) from e
        if proc.returncode != 0:
            raise classify_failure(argv, proc.returncode, proc.stderr)
        return proc.stdout

    def read_json(self, argv: Sequence[str]) -> str:
        """Run a ``--json`` query; raise when its reply carries errors (see
        :func:`classify_reply_errors`), else return the text."""
        text = self.run(argv)
        errors = reply_errors(text)
        if errors:
            raise classify_reply_errors(argv, errors)
        return text

    # --- reading ------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """All nodes, sorted by name."""
        return parse_nodes(self.read_json(["sinfo", "--json"]))

    def node(self, name: str) -> NodeInfo:
        """One node; UsageError naming the known nodes when it does not exist."""
        validate_node_name(name)
        nodes = self.nodes()
        for n in nodes:
            if n.name == name:
                return n
        raise unknown_choice("node", name, [n.name for n in nodes])

    def jobs(self) -> list[JobInfo]:
        """All jobs slurmctld remembers (pending, running, finished within MinJobAge)."""
        return parse_jobs(self.read_json(["squeue", "--json"]))

    def job(self, job_id: str | int) -> JobInfo:
        """One job; UsageError when slurmctld does not know it."""
        jid = validate_job_id(job_id)
        for j in self.jobs():
            if j.job_id == jid:
                return j
        raise UsageError(f"Unknown job {jid}: slurmctld does not know it (finished long ago?)")

    def jobs_on(self, node: str) -> list[JobInfo]:
        """Running or completing jobs that use ``node``."""
        self.node(node)
        return [
            j
            for j in self.jobs()
            if node in j.nodes and j.state in ("RUNNING", "COMPLETING", "SUSPENDED")
        ]

    # --- acting -------------------------------------------------------------------------

    def down(self, node: str, reason: str) -> bool:
        """Set ``node`` DOWN with our reason (``recover:`` is prepended when missing); Slurm
        requeues the requeueable jobs on it and ends the others.

        Returns False (no-op) when it already is DOWN with that reason, or DOWN for someone
        else's reason (which is kept). A node drained by someone else is set DOWN keeping
        their reason, so that our resume never puts it back.
        """
        return self._take_out(node, "DOWN", reason)

    def drain(self, node: str, reason: str) -> bool:
        """Set ``node`` DRAIN with our reason; running jobs keep running, no new ones start.
        A DOWN node becomes IDLE+DRAIN.

        Returns False (no-op) when it already is drained with that reason, or out of
        service for someone else's reason (which is kept).
        """
        return self._take_out(node, "DRAIN", reason)

    def _take_out(self, node: str, state: str, reason: str) -> bool:
        text = mark(reason)
        why = take_out_reason(self.node(node), state, text)
        if why is None:
            return False
        try:
            self.run(["scontrol", "update", f"NodeName={node}", f"State={state}", f"Reason={why}"])
        except SlurmRefusedError:
            # Refused because Slurm got there first (the state we wanted already holds)?
            if take_out_reason(self.node(node), state, text) is None:
                return False
            raise
        return True

    def resume(self, node: str, *, force: bool = False) -> bool:
        """Return ``node`` to service if the mark on it is ours (or ``force``).

        False (no-op) when it is already in service, also when it returned by itself between
        our read and our write (slurmd registering again). Raises ReasonNotOursError naming
        the current reason and who set it when the mark is not ours; an empty reason is not
        ours either (we did not take the node out, so we do not put it back).
        """
        info = self.node(node)
        if not info.out_of_service:
            return False
        if not info.reason_is_ours and not force:
            raise ReasonNotOursError(node, info.reason, info.reason_set_by)
        try:
            self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        except SlurmRefusedError:
            # "Invalid node state specified": the node is no longer DOWN or DRAIN.
            if not self.node(node).out_of_service:
                return False
            raise
        return True

    def down_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        """:meth:`down` for several nodes with one ``scontrol update NodeName=a,b,...``; returns
        the nodes that changed, sorted."""
        return self._take_out_many(nodes, "DOWN", reason)

    def drain_many(self, nodes: Sequence[str], reason: str) -> list[str]:
        """:meth:`drain` for several nodes with one ``scontrol update``; returns those changed."""
        return self._take_out_many(nodes, "DRAIN", reason)

    def _take_out_many(self, nodes: Sequence[str], state: str, reason: str) -> list[str]:
        text = mark(reason)
        for n in nodes:
            validate_node_name(n)
        known = {n.name: n for n in self.nodes()}
        unknown = [n for n in nodes if n not in known]
        if unknown:
            raise unknown_choice("node", unknown[0], known)
        todo: dict[str, list[str]] = {}  # reason to write -> nodes
        for name in sorted(set(nodes)):
            why = take_out_reason(known[name], state, text)
            if why is not None:
                todo.setdefault(why, []).append(name)
        changed: list[str] = []
        for why, names in todo.items():
            argv = ["scontrol", "update", f"NodeName={','.join(names)}", f"State={state}"]
            try:
                self.run([*argv, f"Reason={why}"])
            except SlurmRefusedError:
                now = {n.name: n for n in self.nodes()}
                if any(take_out_reason(now[n], state, text) is not None for n in names):
                    raise
                continue  # every node of the group already holds: none changed by us
            changed += names
        return sorted(changed)

    def signal_job(self, job_id: str | int, signal: str) -> bool:
        """Send ``signal`` to the job's batch step only (``scancel --signal=SIG --batch``).
        False (no-op) when the job is not running, also when it ended between our read and
        the signal."""
        jid = validate_job_id(job_id)
        if not re.fullmatch(r"[A-Z0-9]{2,8}", signal):
            raise UsageError(f"Invalid signal {signal!r}: expected a name such as USR1 or TERM")
        if not self._job_state_is(jid, {"RUNNING"}):
            return False
        try:
            self.run(["scancel", f"--signal={signal}", "--batch", jid])
        except SlurmRefusedError:
            if not self._job_state_is(jid, {"RUNNING"}):
                return False
            raise
        return True

    def requeue(self, job_id: str | int) -> bool:
        """Requeue a job (it goes back to PENDING, restart count + 1). False (no-op) when it is
        already pending or being requeued."""
        jid = validate_job_id(job_id)
        if self.job(jid).state == "PENDING":
            return False
        try:
            self.run(["scontrol", "requeue", jid])
        except SlurmRefusedError as e:
            # Right after a requeue the job is COMPLETING on its old node and slurmctld
            # answers "Job is pending execution": the requeue we asked for already holds.
            if _ALREADY_REQUEUED.search(str(e)) or self.job(jid).state == "PENDING":
                return False
            raise
        return True

    def submit(self, job: BatchJob) -> str:
        """Submit ``job`` with ``sbatch --parsable``; return the new job id.

        Option names are validated (letters, digits, ``-``) so nothing can smuggle in a
        second argument.
        """
        argv = ["sbatch", "--parsable"]
        for key, value in job.options.items():
            if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
                raise UsageError(f"Invalid sbatch option {key!r}: expected e.g. 'requeue'")
            argv.append(f"--{key}" if value is None else f"--{key}={value}")
        if job.workdir is not None:
            argv.append(f"--chdir={job.workdir}")
        argv.extend(job.extra_args)
        out = self.run(argv, stdin=job.script).strip()
        # --parsable prints "jobid" or "jobid;cluster".
        return validate_job_id(out.split(";", 1)[0])

    def cancel(self, job_id: str | int) -> bool:
        """Cancel a job. False (no-op) when it had already finished or slurmctld forgot it,
        also when it finished between our read and the cancel."""
        jid = validate_job_id(job_id)
        if not self._job_state_is(jid, None):
            return False
        try:
            self.run(["scancel", jid])
        except SlurmRefusedError:
            if not self._job_state_is(jid, None):
                return False
            raise
        return True

    def _job_state_is(self, jid: str, states: frozenset[str] | set[str] | None) -> bool:
        """Whether slurmctld knows job ``jid`` in one of ``states`` (None: any state that is
        not finished). A job it forgot is in none."""
        try:
            info = self.job(jid)
        except UsageError:
            return False
        return not info.finished if states is None else info.state in states
