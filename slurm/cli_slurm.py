"""``CliSlurm``: the :class:`recovery.ports.slurm.SlurmControl` port over Slurm's CLI tools.

Every command runs as an argv list (never through a shell) with ``SLURM_CONF`` in its
environment. Works with every Slurm version the project meets (22.05 and newer); see
``slurm.parse`` for the JSON shapes, and ``slurm.control`` for the rules shared with the REST
backend (idempotence, ownership, races).

Without a munge socket (a coordinator in a Kubernetes pod), the commands authenticate with a
JWT instead: ``jwt_file`` holds a token made by ``scontrol token`` for a user allowed to update
nodes, and slurmctld must accept ``AuthAltTypes=auth/jwt``. Slurm 22.05's commands send it when
``SLURM_JWT`` is set (checked on the local cluster: scontrol drained a node as root with no
munge socket at all). This is how nodes are taken out from inside Kubernetes with 22.05, whose
slurmrestd has no node update (see ``slurm.rest_slurm``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recovery.errors import (
    SlurmError,
    SlurmNotInstalledError,
    SlurmRefusedError,
    SlurmUnavailableError,
    UsageError,
)
from recovery.ports.slurm import BatchJob, JobInfo, NodeInfo, validate_job_id
from slurm import install
from slurm.control import SlurmBase
from slurm.parse import UNREACHABLE, parse_jobs, parse_nodes, reply_errors

INSTALL_HINT = "install them with `apt-get install -y slurm-wlm munge` (or `./scripts/setup.sh`)"


def classify_failure(argv: Sequence[str], returncode: int, stderr: str) -> SlurmError | Exception:
    """Map a failed Slurm command to our errors: unreachable -> SlurmUnavailableError
    (transient), anything else -> SlurmRefusedError (a verdict). Pure; used by CliSlurm."""
    cmd = " ".join(argv[:3])
    msg = stderr.strip() or f"exit status {returncode}"
    if UNREACHABLE.search(stderr):
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
    if any(e.get("errno") == -1 or UNREACHABLE.search(str(e.get("error", ""))) for e in errors):
        return SlurmUnavailableError(f"{cmd}: slurmctld unreachable: {text}", delay=1.0)
    return SlurmRefusedError(f"{cmd}: refused: {text}")


def _parse_version(text: str) -> tuple[int, int]:
    # `scontrol --version` prints "slurm 22.05.8" (or "slurm-wlm 22.05.8" on some builds).
    m = re.search(r"(\d+)\.(\d+)", text)
    if m is None:
        raise SlurmError(f"scontrol --version printed no version: {text.strip()[:100]!r}")
    return int(m.group(1)), int(m.group(2))


class CliSlurm(SlurmBase):
    """SlurmControl through ``scontrol``, ``sinfo``, ``squeue``, ``sbatch`` and ``scancel``.

    ``conf_path`` is the slurm.conf every command is pointed at (``SLURM_CONF``); ``timeout_s``
    bounds each command in seconds (a timeout is a SlurmUnavailableError); ``jwt_file``, when
    given, holds the JWT sent as ``SLURM_JWT`` (read again for every command, so a rotated
    token is picked up; a missing file is a UsageError).

    The commands are those of the install the conf names (:func:`slurm.install.of_conf`: our
    local cluster's conf says 22.05 or 25.11), else those on ``PATH``. Reads follow the
    version: 23.02 and later list nodes with ``scontrol show nodes --json`` (25.11's ``sinfo
    --json`` lists none) and jobs with ``squeue --json --states=all`` (without it, 25.11 hides
    finished jobs).
    """

    def __init__(
        self,
        conf_path: str | Path,
        *,
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
        jwt_file: str | Path | None = None,
    ) -> None:
        self.conf_path = Path(conf_path)
        self.timeout_s = timeout_s
        self.jwt_file = Path(jwt_file) if jwt_file is not None else None
        base = dict(os.environ if env is None else env)
        base["SLURM_CONF"] = str(self.conf_path)
        self.install = install.of_conf(self.conf_path)
        self._env = install.command_env(self.install, base)
        self._series: tuple[int, int] | None = self.install.series if self.install else None

    # --- transport ----------------------------------------------------------------------

    def _command_env(self) -> dict[str, str]:
        if self.jwt_file is None:
            return self._env
        try:
            token = self.jwt_file.read_text().strip()
        except OSError as e:
            raise UsageError(f"Cannot read the Slurm JWT file {self.jwt_file}: {e}") from e
        return {**self._env, "SLURM_JWT": token}

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
                env=self._command_env(),
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

    def series(self) -> tuple[int, int]:
        """The Slurm series of the commands run, e.g. ``(25, 11)``: the conf's install, else
        asked once of ``scontrol --version``."""
        if self._series is None:
            self._series = _parse_version(self.run(["scontrol", "--version"]))
        return self._series

    # --- reading ------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """All nodes, sorted by name."""
        if self.series() >= (23, 2):
            argv = ["scontrol", "show", "nodes", "--json"]
            return parse_nodes(self.read_json(argv), what="scontrol show nodes --json")
        return parse_nodes(self.read_json(["sinfo", "--json"]))

    def jobs(self) -> list[JobInfo]:
        """All jobs slurmctld remembers (pending, running, finished within MinJobAge)."""
        if self.series() >= (23, 2):
            return parse_jobs(self.read_json(["squeue", "--json", "--states=all"]))
        return parse_jobs(self.read_json(["squeue", "--json"]))

    def expedited_requeue(self) -> bool:
        """Whether this cluster takes ``sbatch --requeue=expedite``: Slurm 25.11 or later with
        ``SlurmctldParameters=enable_expedited_requeue`` (from ``scontrol show config``)."""
        if self.series() < (25, 11):
            return False
        for line in self.run(["scontrol", "show", "config"]).splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "SlurmctldParameters":
                return "enable_expedited_requeue" in [p.strip() for p in value.split(",")]
        return False

    # --- raw requests (the rules around them are in SlurmBase) ---------------------------

    def _request_update(self, nodes: Sequence[str], state: str, reason: str) -> None:
        # One `scontrol update NodeName=a,b,...` for the whole group.
        self.run(
            ["scontrol", "update", f"NodeName={','.join(nodes)}", f"State={state}",
             f"Reason={reason}"]
        )  # fmt: skip

    def _request_resume(self, node: str) -> None:
        self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    def _request_signal(self, job_id: str, signal: str) -> None:
        # --batch: the batch shell only, which the sbatch wrapper forwards to training.
        self.run(["scancel", f"--signal={signal}", "--batch", job_id])

    def _request_requeue(self, job_id: str) -> None:
        self.run(["scontrol", "requeue", job_id])

    def _request_cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def _request_release(self, job_id: str) -> None:
        self.run(["scontrol", "release", job_id])

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
