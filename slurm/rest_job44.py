"""A :class:`BatchJob` as slurmrestd's v0.0.44 job submission (Slurm 25.11): a pure translation.

Unlike 22.05's v0.0.38 (``slurm.rest_job``), v0.0.44 no longer parses option values with
sbatch's own parsers: fields are typed, so what sbatch takes as text is translated here:

* ``--time=[D-]HH:MM:SS`` (and sbatch's other forms) -> ``time_limit`` in minutes;
* ``--signal=[B:]SIG@T`` -> ``kill_warning_signal``/``kill_warning_delay``, and ``B:`` (the
  batch shell only, which ``recover sbatch`` relies on) -> ``kill_warning_flags: [BATCH_JOB]``;
* ``--requeue=expedite`` -> ``requeue`` plus the job flag ``EXPEDITED_REQUEUE``;
* ``--open-mode=append`` -> ``open_mode: [APPEND]``;
* ``--export`` -> ``environment`` as ``NAME=value`` strings (``SLURM_JWT`` never sent);
* ``--nodelist``/``--exclude`` -> ``required_nodes``/``excluded_nodes`` lists.

Options outside :data:`FIELDS` raise UsageError naming those that are known; a value that does
not parse raises UsageError saying what form it takes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from recovery.errors import UsageError, unknown_choice
from recovery.ports.slurm import BatchJob
from slurm.rest_job import _options, job_environment

_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_SIGNAL_RE = re.compile(r"^(?:(R?B?|B?R?):)?([A-Za-z0-9]+)(?:@(\d+))?$")


def minutes(value: str) -> int:
    """sbatch's ``--time`` as whole minutes (rounded up): ``MM``, ``MM:SS``, ``HH:MM:SS``,
    ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``. Raises UsageError for anything else."""
    m = _TIME_RE.match(value.strip())
    if m is None:
        raise UsageError(
            f"Invalid --time {value!r}: expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
        )
    days, a, b, c = m.groups()
    if days is None:
        if b is None:  # MM
            secs = int(a) * 60
        elif c is None:  # MM:SS
            secs = int(a) * 60 + int(b)
        else:  # HH:MM:SS
            secs = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # D-HH[:MM[:SS]]
        secs = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    return -(-secs // 60)


def _signal(value: str) -> dict[str, Any]:
    m = _SIGNAL_RE.match(value.strip())
    if m is None:
        raise UsageError(f"Invalid --signal {value!r}: expected [B:]SIG[@SECONDS], e.g. B:USR1@60")
    prefix, sig, delay = m.groups()
    out: dict[str, Any] = {"kill_warning_signal": sig.upper().removeprefix("SIG")}
    out["kill_warning_delay"] = int(delay) if delay else 60
    if prefix and "B" in prefix.upper():
        out["kill_warning_flags"] = ["BATCH_JOB"]
    return out


def _requeue(value: str | None) -> dict[str, Any]:
    if value is None:
        return {"requeue": True}
    if value.lower() == "expedite":
        return {"requeue": True, "flags": ["EXPEDITED_REQUEUE"]}
    raise UsageError(f"Invalid --requeue={value}: expected --requeue or --requeue=expedite")


def _open_mode(value: str | None) -> dict[str, Any]:
    mode = (value or "").upper()
    if mode not in ("APPEND", "TRUNCATE"):
        raise UsageError(f"Invalid --open-mode={value}: expected append or truncate")
    return {"open_mode": [mode]}


def _text(field: str) -> Callable[[str | None], dict[str, Any]]:
    def conv(value: str | None) -> dict[str, Any]:
        if value is None:
            raise UsageError(f"sbatch option for {field} needs a value (--OPTION=VALUE)")
        return {field: value}

    return conv


def _number(field: str) -> Callable[[str | None], dict[str, Any]]:
    def conv(value: str | None) -> dict[str, Any]:
        if value is None or not value.isdigit():
            raise UsageError(f"{field} takes a whole number, not {value!r}")
        return {field: int(value)}

    return conv


def _names(field: str) -> Callable[[str | None], dict[str, Any]]:
    def conv(value: str | None) -> dict[str, Any]:
        return {field: [n for n in (value or "").split(",") if n]}

    return conv


#: sbatch long options and how each becomes v0.0.44 fields.
FIELDS: dict[str, Callable[[str | None], dict[str, Any]]] = {
    "job-name": _text("name"),
    "output": _text("standard_output"),
    "error": _text("standard_error"),
    "input": _text("standard_input"),
    "chdir": _text("current_working_directory"),
    "partition": _text("partition"),
    "account": _text("account"),
    "comment": _text("comment"),
    "dependency": _text("dependency"),
    "array": _text("array"),
    "nodes": _text("nodes"),
    "qos": _text("qos"),
    "reservation": _text("reservation"),
    "constraint": _text("constraints"),
    "ntasks": _number("tasks"),
    "ntasks-per-node": _number("tasks_per_node"),
    "cpus-per-task": _number("cpus_per_task"),
    "mem": _number("memory_per_node"),
    "nodelist": _names("required_nodes"),
    "exclude": _names("excluded_nodes"),
    "time": lambda v: {"time_limit": minutes(v or "")},
    "signal": lambda v: _signal(v or ""),
    "requeue": _requeue,
    "no-requeue": lambda _: {"requeue": False},
    "open-mode": _open_mode,
    "hold": lambda _: {"hold": True},
}


def job_request44(job: BatchJob, env: Mapping[str, str]) -> dict[str, Any]:
    """The body of ``POST /slurm/v0.0.44/job/submit`` for ``job``; ``env`` is what ``ALL``
    exports. Raises UsageError for an option this translation does not know or a value that
    does not parse."""
    props: dict[str, Any] = {}
    export: str | None = None
    for key, value in _options(job):
        if key == "export":
            export = value if value is not None else "ALL"
            continue
        conv = FIELDS.get(key)
        if conv is None:
            raise unknown_choice("sbatch option for slurmrestd v0.0.44", key, [*FIELDS, "export"])
        for field, val in conv(value).items():
            if field == "flags":
                props.setdefault("flags", []).extend(val)
            else:
                props[field] = val
    if job.workdir is not None:
        props.setdefault("current_working_directory", job.workdir)
    environment = job_environment(export, env)
    props["environment"] = [f"{k}={v}" for k, v in environment.items()]
    return {"script": job.script, "job": props}
