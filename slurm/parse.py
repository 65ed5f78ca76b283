"""Pure parsers for Slurm's JSON output (``sinfo --json``, ``squeue --json``) and hostlists.

Two shapes are understood:

* Slurm 22.05 (OpenAPI v0.0.38): a node's ``state`` is a lower-case string plus a
  ``state_flags`` list; a job's ``job_state`` is a string; numbers are plain.
* Slurm 23.02 and later (v0.0.39+): ``state`` / ``job_state`` are lists of upper-case strings
  (base state first, then flags, e.g. ``["IDLE", "DRAIN"]``) and many numbers are wrapped as
  ``{"set": true, "infinite": false, "number": 3}``.

Every function here is pure: text in, values out. Malformed input raises :class:`SlurmError`
with what was expected.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from recovery.errors import SlurmError
from recovery.ports.slurm import NODE_BASE_STATES, JobInfo, NodeInfo

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")

#: Text in a command's stderr or a REST error meaning slurmctld could not be reached: worth
#: retrying later (both backends classify with it).
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|timed out|Socket timed out"
    r"|Zero Bytes were transmitted|Communication connection failure|Unable to connect"
    r"|Could not establish a configuration source|Slurm backup controller in standby",
    re.IGNORECASE,
)


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist such as ``node[1-3,5],spare1`` into its names, in order.

    Zero padding is kept (``n[01-02]`` gives ``n01, n02``). Raises SlurmError when malformed.
    """
    names: list[str] = []
    for item in _split_top_level(text.strip()):
        if not item:
            continue
        if "[" not in item:
            names.append(item)
            continue
        head, _, rest = item.partition("[")
        body, close, tail = rest.partition("]")
        if not close or "[" in tail:
            raise SlurmError(f"cannot parse hostlist {text!r}: unbalanced brackets in {item!r}")
        for part in body.split(","):
            m = _RANGE_RE.match(part)
            if not m:
                raise SlurmError(f"cannot parse hostlist {text!r}: bad range {part!r}")
            lo, hi = m.group(1), m.group(2) or m.group(1)
            width = len(lo) if lo.startswith("0") else 0
            for i in range(int(lo), int(hi) + 1):
                names.append(f"{head}{i:0{width}d}{tail}")
    return tuple(names)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def number(value: Any, default: int | None = 0) -> int | None:
    """Unwrap a Slurm number: a plain int, or ``{"set": bool, "infinite": bool, "number": n}``.

    An unset or infinite wrapped number gives ``default``.
    """
    if isinstance(value, bool):  # bool is an int subclass; Slurm never means a number by it
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return default
        return number(value.get("number"), default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def split_state(state: Any, flags: Any = None) -> tuple[str, frozenset[str]]:
    """Return (base state, flags) from either shape, upper-cased.

    22.05: ``state="idle"``, ``flags=["DRAIN"]``. 23+: ``state=["IDLE", "DRAIN"]``. A 22.05
    string may also carry ``+`` joined flags (``"idle+drain"``), as ``scontrol`` prints.
    """
    items: list[str]
    if isinstance(state, str):
        items = [s for s in state.upper().split("+") if s]
    elif isinstance(state, list):
        items = [str(s).upper() for s in state]
    else:
        raise SlurmError(f"unexpected state {state!r}: expected a string or a list of strings")
    if isinstance(flags, list):
        items += [str(f).upper() for f in flags]
    base = next((s for s in items if s in NODE_BASE_STATES), items[0] if items else "UNKNOWN")
    rest = frozenset(s for s in items if s != base)
    return base, rest


#: Job state flags that decide what a job is for the port, whichever shape says so: a job
#: COMPLETING still holds its nodes (whatever its base state: 22.05's JSON and pyslurm name it
#: by this flag alone), and a job in REQUEUE_HOLD waits to be released (Slurm 25.11 holds an
#: expedited job whose script failed while no Epilog failed).
JOB_STATE_FLAGS = ("COMPLETING", "REQUEUE_HOLD")
#: What the other flags Slurm's ``job_state_string`` names a job by (one word: 22.05's JSON,
#: pyslurm) say of its base state.
JOB_FLAG_BASE = {
    "CONFIGURING": "RUNNING", "RESIZING": "RUNNING", "SIGNALING": "RUNNING",
    "STOPPED": "RUNNING", "STAGE_OUT": "COMPLETING", "REQUEUED": "PENDING",
    "REQUEUE_FED": "PENDING", "EXPEDITING": "PENDING", "RESV_DEL_HOLD": "PENDING",
    "SPECIAL_EXIT": "REQUEUE_HOLD",
}  # fmt: skip


def job_state(value: Any) -> tuple[str, frozenset[str]]:
    """(state, other words) of a job's ``job_state``: 22.05's one word as it is; 23.02+'s list
    (``["FAILED", "COMPLETING"]``) as the first of :data:`JOB_STATE_FLAGS` it holds, else its
    base state (the first word). Raises SlurmError for neither shape."""
    if not isinstance(value, list):
        return split_state(value)
    items = [str(s).upper() for s in value]
    state = next((f for f in JOB_STATE_FLAGS if f in items), items[0] if items else "UNKNOWN")
    return state, frozenset(s for s in items if s != state)


def job_state_word(word: str) -> tuple[str, frozenset[str]]:
    """(state, flags) of the one word Slurm's ``job_state_string`` gives (pyslurm's
    ``Job.state``): a flag in :data:`JOB_FLAG_BASE` becomes the base state it implies, kept
    among the flags. Pure."""
    upper = word.upper()
    if upper in JOB_FLAG_BASE:
        return JOB_FLAG_BASE[upper], frozenset({upper})
    return upper or "UNKNOWN", frozenset()


def _load(text: str, key: str, what: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlurmError(f"{what} did not print JSON: {e}; output began {text[:200]!r}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise SlurmError(f"{what} JSON has no {key!r} list; keys: {sorted(doc)[:10]}")
    errors = [e for e in doc.get("errors") or [] if e]
    if errors:
        raise SlurmError(f"{what} reported errors: {errors}")
    return [item for item in doc[key] if isinstance(item, dict)]


def reply_errors(text: str) -> list[dict[str, Any]]:
    """The non-empty entries of a JSON reply's ``errors`` list; [] when the text is not JSON
    (the parsers then say what is wrong with it)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return []
    errors = doc.get("errors") if isinstance(doc, dict) else None
    return [e for e in errors or [] if isinstance(e, dict) and e]


def parse_nodes(text: str, what: str = "sinfo --json") -> list[NodeInfo]:
    """Parse ``sinfo --json`` output (or slurmrestd's ``GET nodes``, the same shape; ``what``
    names the source in errors) into nodes sorted by name (duplicates per partition merged).

    Raises SlurmError when the text is not the expected JSON.
    """
    seen: dict[str, NodeInfo] = {}
    for raw in _load(text, "nodes", what):
        name = raw.get("name") or raw.get("hostname")
        if not isinstance(name, str):
            raise SlurmError(f"{what} node without a name: {sorted(raw)[:10]}")
        state, flags = split_state(raw.get("state", "UNKNOWN"), raw.get("state_flags"))
        parts = raw.get("partitions") or []
        # Slurm 25.11 keeps a resumed node's last reason; a reason means something only while
        # the node is out of service (22.05 clears it on resume).
        out = state == "DOWN" or "DRAIN" in flags
        seen[name] = NodeInfo(
            name=name,
            state=state,
            flags=flags,
            reason=str(raw.get("reason") or "") if out else "",
            reason_set_by=str(raw.get("reason_set_by_user") or "") if out else "",
            cpus=number(raw.get("cpus"), 0) or 0,
            partitions=tuple(str(p) for p in parts) if isinstance(parts, list) else (),
            features=_features(raw.get("active_features") or raw.get("features")),
            reason_changed_at=float(number(raw.get("reason_changed_at"), 0) or 0) if out else 0.0,
        )
    return [seen[n] for n in sorted(seen)]


def _features(value: Any) -> frozenset[str]:
    # 22.05: "rack1,nvl2" (or ""); 23+: a list of strings.
    if isinstance(value, str):
        return frozenset(f for f in value.split(",") if f.strip())
    if isinstance(value, list):
        return frozenset(str(f) for f in value if str(f).strip())
    return frozenset()


def parse_jobs(text: str, what: str = "squeue --json") -> list[JobInfo]:
    """Parse ``squeue --json`` output (or slurmrestd's ``GET jobs``, the same shape; ``what``
    names the source in errors) into jobs sorted by numeric id.

    Raises SlurmError when the text is not the expected JSON.
    """
    jobs = []
    for raw in _load(text, "jobs", what):
        job_id = number(raw.get("job_id"), None)
        if job_id is None:
            raise SlurmError(f"{what} job without a job_id: {sorted(raw)[:10]}")
        state, flags = job_state(raw.get("job_state", "UNKNOWN"))
        # 25.11 still lists a requeued (pending) job's last nodes; a pending job holds none.
        nodes = raw.get("nodes") or "" if state != "PENDING" else ""
        exit_code, signal = exit_status(raw.get("exit_code"))
        requeue = raw.get("requeue")
        job = JobInfo(
            job_id=str(job_id),
            name=str(raw.get("name") or ""),
            state=state,
            nodes=expand_hostlist(nodes) if isinstance(nodes, str) else (),
            restart_count=number(raw.get("restart_cnt"), 0) or 0,
            reason=str(raw.get("state_reason") or ""),
            exit_code=exit_code,
            flags=flags | frozenset(str(f) for f in raw.get("flags") or []),
            signal=signal,
            requeueable=requeue if isinstance(requeue, bool) else True,
            batch_host=str(raw.get("batch_host") or ""),
            comment=_comment(raw.get("comment")),
        )
        if job.finished:
            # A live job's end_time is Slurm's projection (start + time limit, or far ahead).
            job = replace(job, end_time=float(number(raw.get("end_time"), 0) or 0))
        jobs.append(job)
    return sorted(jobs, key=lambda j: int(j.job_id))


def _comment(value: Any) -> str:
    # 22.05 and 25.11 give the job's comment as a string; some versions nest the three kinds
    # (``{"job": ..., "administrator": ..., "system": ...}``).
    if isinstance(value, dict):
        value = value.get("job")
    return value if isinstance(value, str) else ""


def exit_status(value: Any) -> tuple[int | None, int | None]:
    """(exit status, signal) of a job's ``exit_code`` field, in either shape; each None when
    unknown or not applicable. Pure.

    * 22.05: a plain int, the raw wait status: ``34304`` is exit 134 (``ExitCode=134:0``),
      ``9`` is killed by SIGKILL (``ExitCode=0:9``).
    * 23+: ``{"status": ["ERROR"], "return_code": {...134}, "signal": {"id": {...}, "name":
      ...}}``, numbers wrapped; a pending job's ``return_code`` is unset.
    """
    if isinstance(value, dict):
        code = number(value.get("return_code"), None)
        sig = value.get("signal")
        signum = number(sig.get("id"), None) if isinstance(sig, dict) else None
        return code, signum or None
    raw = number(value, None)
    if raw is None:
        return None, None
    if raw & 0x7F:  # WIFSIGNALED: the low 7 bits name the signal
        return 0, raw & 0x7F
    return (raw >> 8) & 0xFF, None
