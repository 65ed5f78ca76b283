"""A :class:`BatchJob` (sbatch options) as slurmrestd's job submission: a pure translation.

slurmrestd 22.05 takes the options under its own names (``standard_output`` for ``--output``,
``time_limit`` for ``--time``, ...) and parses their values with sbatch's own parsers, so
values pass through as text. Two things sbatch does on the client side are done here:

* ``--export``: slurmrestd wants the job's whole ``environment`` and refuses ``export``.
  ``ALL`` (sbatch's default) is the environment the backend was given plus any ``NAME=value``
  listed; a list without ``ALL`` is just those variables; ``NONE`` sends only
  ``SLURM_EXPORT_ENV=NONE``, as sbatch does. ``SLURM_JWT`` (a credential) is never sent.
* ``--chdir`` / ``BatchJob.workdir``: ``current_working_directory``.

What 22.05 cannot express is refused, never approximated: ``--signal=B:SIG@T`` (the warning
to the batch shell only, which ``recover sbatch`` uses) is answered "Invalid SIGNAL
specification" by slurmrestd 22.05, and sending it to the job steps instead would never reach
a batch script that runs training itself; such a job raises SlurmUnsupportedError. Options
outside :data:`RENAMED` and :data:`SAME` raise UsageError naming those that are known.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from recovery.errors import SlurmUnsupportedError, UsageError, unknown_choice
from recovery.ports.slurm import BatchJob

#: sbatch long options whose slurmrestd name differs.
RENAMED = {
    "job-name": "name",
    "output": "standard_output",
    "error": "standard_error",
    "input": "standard_input",
    "chdir": "current_working_directory",
    "time": "time_limit",
    "time-min": "time_minimum",
    "mem": "memory_per_node",
    "mem-per-cpu": "memory_per_cpu",
    "mem-per-gpu": "memory_per_gpu",
    "exclude": "exclude_nodes",
    "begin": "begin_time",
    "constraint": "constraints",
    "mincpus": "minimum_cpus_per_node",
    "tmp": "temporary_disk_per_node",
    "licenses": "licenses",
    "kill-on-invalid-dep": "kill_on_invalid_dependency",
}
#: sbatch long options slurmrestd knows under the same name (``-`` written ``_``).
SAME = frozenset(
    {
        "account", "array", "comment", "cpus-per-task", "cpus-per-gpu", "deadline",
        "delay-boot", "dependency", "exclusive", "gpus", "gpus-per-node", "gpus-per-task",
        "gres", "hold", "mail-type", "mail-user", "nice", "no-requeue", "nodelist", "nodes",
        "ntasks", "ntasks-per-node", "open-mode", "partition", "priority", "qos", "requeue",
        "reservation", "signal", "wait-all-nodes", "wckey",
    }
)  # fmt: skip
#: Options given without a value, and what slurmrestd 22.05 accepts for them (checked on the
#: real daemon; it refuses ``true`` for ``exclusive``, which takes the mode as text).
SWITCHES: dict[str, Any] = {
    "requeue": True,
    "no-requeue": True,
    "hold": True,
    "exclusive": "exclusive",
}
_OPTION_RE = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.DOTALL)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NEVER_SENT = frozenset({"SLURM_JWT"})


def job_request(job: BatchJob, env: Mapping[str, str]) -> dict[str, Any]:
    """The body of ``POST /slurm/v0.0.38/job/submit`` for ``job``; ``env`` is what ``ALL``
    exports. Raises UsageError for an option slurmrestd does not know (or a malformed extra
    argument), SlurmUnsupportedError for ``--signal=B:...`` (see the module docstring)."""
    props: dict[str, Any] = {}
    export: str | None = None
    for key, value in _options(job):
        if key == "export":
            export = value if value is not None else "ALL"
            continue
        if key == "signal" and value is not None and value.upper().startswith("B:"):
            raise SlurmUnsupportedError(
                f"--signal={value}: slurmrestd 22.05 refuses a signal for the batch shell "
                "only ('Invalid SIGNAL specification'), and to the job steps it would never "
                "reach a batch script running training itself; submit with the CLI backend"
            )
        props[_rest_name(key)] = _value(key, value)
    if job.workdir is not None:
        props["current_working_directory"] = job.workdir
    props["environment"] = job_environment(export, env)
    return {"script": job.script, "job": props}


def job_environment(export: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """The job's environment for an sbatch ``--export`` value (None: sbatch's default, ALL).

    Raises UsageError for an entry that is neither ALL, NONE, NAME nor NAME=value.
    """
    spec = "ALL" if export is None else export
    if spec.strip().upper() == "NONE":
        return {"SLURM_EXPORT_ENV": "NONE"}
    out: dict[str, str] = {}
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if any(e.upper() == "ALL" for e in entries):
        out.update(env)
    for entry in entries:
        if entry.upper() == "ALL":
            continue
        name, eq, value = entry.partition("=")
        if not _NAME_RE.fullmatch(name):
            raise UsageError(
                f"Invalid --export entry {entry!r}: expected ALL, NONE, NAME or NAME=value"
            )
        if eq:
            out[name] = value
        elif name in env:
            out[name] = env[name]
    for name in _NEVER_SENT:
        out.pop(name, None)
    # slurmrestd refuses an empty environment ("environment must be set").
    return out or {"SLURM_EXPORT_ENV": "NONE"}


def _options(job: BatchJob) -> Iterator[tuple[str, str | None]]:
    yield from job.options.items()
    for arg in job.extra_args:
        m = _OPTION_RE.fullmatch(arg)
        if m is None:
            raise UsageError(
                f"Invalid sbatch argument {arg!r} for slurmrestd: give long options as "
                "--name=value (or --switch), e.g. --time=10:00"
            )
        yield m.group(1), m.group(2)


def _rest_name(key: str) -> str:
    if key in RENAMED:
        return RENAMED[key]
    if key in SAME:
        return key.replace("-", "_")
    raise unknown_choice("sbatch option for slurmrestd", key, [*RENAMED, *SAME, "export"])


def _value(key: str, value: str | None) -> Any:
    if value is not None:
        return value
    if key not in SWITCHES:
        raise UsageError(f"sbatch option --{key} needs a value (--{key}=VALUE)")
    return SWITCHES[key]
