"""Reading scenario files: YAML in, a :class:`scenarios.schema.Scenario` out, or an error that
names the file, the line and the field path of every problem, with the valid choices.

``faults[1].via`` at line 14 reads ``scenarios/x.yaml:14: faults[1].via: Input should be
'agent' or 'kmsg' (got 'kmesg')``. Line numbers come from the YAML node tree (``yaml.compose``),
kept beside the data, so a pydantic error's location maps back to where the user wrote it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from recovery.errors import UsageError, unknown_choice
from scenarios import command_job
from scenarios.schema import FAULT_NODE, JOB_NODE, Scenario

Loc = tuple[str | int, ...]

#: Where the shipped scenarios live (installed with the package).
SHIPPED_DIR = Path(__file__).parent / "shipped"


class ScenarioFileError(UsageError):
    """A scenario file is unreadable, not YAML, or breaks the schema; one line per problem."""


@dataclass(frozen=True)
class Loaded:
    """A valid scenario and the text it was read from (copied into the run directory)."""

    scenario: Scenario
    text: str
    path: Path | None


def load_file(path: Path) -> Loaded:
    """Read and validate the scenario at ``path``; its name defaults to the file's stem.

    Raises ScenarioFileError listing every problem as ``FILE:LINE: field.path: message``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioFileError(f"{path}: cannot be read ({e.strerror or e})") from e
    scenario = load_text(text, str(path), default_name=path.stem)
    return Loaded(command_job.beside(scenario, path.parent), text, path)


def load_text(text: str, source: str, *, default_name: str) -> Scenario:
    """Validate scenario YAML ``text``; ``source`` names it in errors. See :func:`load_file`."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ScenarioFileError(f"{source}{line}: not valid YAML: {problem}") from e
    lines: dict[Loc, int] = {}
    if root is not None:
        _index(root, (), lines)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise ScenarioFileError(f"{source}:1: expected a mapping of scenario keys, got {got}")
    data.setdefault("name", default_name)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioFileError(_render(e, source, lines)) from None
    problems = semantic_problems(scenario)
    if problems:
        raise ScenarioFileError(
            "\n".join(f"{source}:{_line(loc, lines)}: {dotted(loc)}: {m}" for loc, m in problems)
        )
    return scenario


def _process_problems(s: Scenario, job_nodes: int) -> list[tuple[Loc, str]]:
    """More processes than the job (or the cluster) has nodes; a batch that does not divide."""
    from recovery.train.model import MODELS  # the schema checked the name already

    count = s.job.process_count(min(job_nodes, s.cluster.nodes))
    fits = min(job_nodes, s.cluster.nodes)
    if count > fits:
        return [(("job", "processes"), f"{count} processes, one per node, but the job has "
                 f"{fits} node(s) (cluster.nodes {s.cluster.nodes}, job.nodes {s.job.nodes}): "
                 f"ask for at most {fits}, or for more nodes")]  # fmt: skip
    batch = MODELS[s.job.model].batch_size
    if batch % count:
        fit = [m for m, spec in MODELS.items() if spec.batch_size % count == 0]
        return [(("job", "model"), f"{s.job.model}'s batch of {batch} does not divide over "
                 f"{count} processes; models whose batch does: {', '.join(fit)}")]  # fmt: skip
    return []


def semantic_problems(s: Scenario) -> list[tuple[Loc, str]]:
    """What the schema alone cannot see: node names against the cluster, a burst larger than
    the job, local-only faults on an existing cluster. ``(location, message)`` pairs."""
    problems: list[tuple[Loc, str]] = []
    c = s.cluster
    if not s.local:
        for key in ("nodes", "spares", "policy", "slurmd_timeout_s", "cred_expire_s"):
            if key in c.model_fields_set:
                problems.append((("cluster", key), "describes the local cluster; "
                                 "remove it (or existing) to choose one"))  # fmt: skip
        for i, e in enumerate(s.faults):
            if e.fault in (
                "slurmd-crash", "node-hang", "coordinator-kill", "main-thread-hang",
                "process-freeze", "cpu-throttle",
            ):  # fmt: skip
                problems.append((("faults", i, "fault"), f"{e.fault} needs the local cluster"))
            if e.crash_training:
                problems.append((("faults", i, "crash_training"), "needs the local cluster"))
        return problems
    names = [f"node{i}" for i in range(1, c.nodes + 1)]
    spares = [f"spare{i}" for i in range(1, c.spares + 1)]
    held = s.job.job_spares
    job_nodes = c.nodes - held if s.job.nodes == "all" else int(s.job.nodes)
    if job_nodes + held > c.nodes:
        what = f"{job_nodes} nodes" + (f" and {held} spare(s) in the job" if held else "")
        fits = f" (at most {c.nodes - job_nodes} spare(s) fit)" if held else ""
        loc: Loc = ("job", "spares") if held else ("job", "nodes")
        problems.append((loc, f"asks for {what}; the cluster has {c.nodes} in service{fits}"))
    elif job_nodes < 1:
        problems.append((("job", "spares"), f"{held} spare(s) in the job leave no node of the "
                         f"cluster's {c.nodes} to train on"))  # fmt: skip
    if job_nodes >= 1:
        problems += _process_problems(s, job_nodes)
    valid = [*names, *spares, JOB_NODE, FAULT_NODE]
    for i, e in enumerate(s.faults):
        if s.job.mode == "in-allocation" and e.when.trigger == ("job", "requeued"):
            problems.append((("faults", i, "when"), "job: requeued never fires in-allocation "
                             "(the job relaunches on its own spare, it is not requeued); run "
                             "this scenario in requeue mode"))  # fmt: skip
        if e.node is not None and e.node not in valid:
            problems.append((("faults", i, "node"), str(unknown_choice("node", e.node, valid))))
        if e.where == FAULT_NODE and not any(f.where for f in s.faults[:i] if f.fault):
            problems.append(((("faults", i, "node") if e.node else ("faults", i)),
                             "fault-node: no fault on a node comes before it"))  # fmt: skip
        if e.burst is not None and e.burst > job_nodes:
            problems.append((("faults", i, "burst"), f"{e.burst} nodes, but the job runs on "
                             f"{job_nodes}"))  # fmt: skip
    for where in ("expect", "expect_in_allocation"):
        expect = getattr(s, where)
        for key in ("out_of_service", "in_service"):
            for j, node in enumerate(getattr(expect, key, None) or ()):
                if node not in names + spares:
                    problems.append(
                        ((where, key, j), str(unknown_choice("node", node, names + spares)))
                    )
    return problems


def shipped() -> list[Loaded]:
    """Every shipped scenario, by name. Raises ScenarioFileError for a broken one (a bug)."""
    return sorted((load_file(p) for p in SHIPPED_DIR.glob("*.yaml")), key=lambda x: x.scenario.name)


def with_mode(loaded: Loaded, mode: str | None) -> Loaded:
    """``loaded`` with its job in recovery ``mode`` (``recover scenario run --mode``; None:
    as the file says). Raises UsageError for an unknown mode, ScenarioFileError when the
    scenario cannot run in it (naming why)."""
    if mode is None or mode == loaded.scenario.job.mode:
        return loaded
    moved = loaded.scenario.in_mode(mode)
    problems = semantic_problems(moved)
    if problems:
        where = loaded.path or loaded.scenario.name
        raise ScenarioFileError(
            "\n".join(f"{where} (--mode {mode}): {dotted(loc)}: {m}" for loc, m in problems)
        )
    return dataclasses.replace(loaded, scenario=moved)


def find(name_or_path: str) -> Loaded:
    """A scenario file by path, or a shipped scenario by name (``xid79``).

    Raises UsageError naming the shipped scenarios when it is neither.
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ScenarioFileError(f"{path}: no such file")
        return load_file(path)
    candidate = SHIPPED_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return load_file(candidate)
    names = sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))
    raise unknown_choice("scenario (a shipped name or a .yaml file)", name_or_path, names)


# --- locations -> lines ---------------------------------------------------------------------


def _index(node: yaml.Node, loc: Loc, out: dict[Loc, int]) -> None:
    """Record the line (1-based) of every mapping key and sequence item under ``node``."""
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*loc, str(key.value))
            out[here] = key.start_mark.line + 1
            _index(value, here, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            here = (*loc, i)
            out[here] = item.start_mark.line + 1
            _index(item, here, out)


def _line(loc: Loc, lines: dict[Loc, int]) -> int:
    """The line of the longest prefix of ``loc`` that the file contains (1 for none)."""
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return 1


def dotted(loc: Sequence[str | int]) -> str:
    """``("faults", 1, "via")`` -> ``faults[1].via``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _render(error: ValidationError, source: str, lines: dict[Loc, int]) -> str:
    out = []
    for item in error.errors(include_url=False):
        # pydantic marks a bad mapping key with a "[key]" element after the key itself.
        loc: Loc = tuple(p for p in item["loc"] if p != "[key]")
        out.append(f"{source}:{_line(loc, lines)}: {dotted(loc)}: {_message(item, loc)}")
    return "\n".join(out)


def _message(item: Any, loc: Loc) -> str:
    kind = item["type"]
    if kind == "extra_forbidden":
        valid = _fields_at(loc[:-1])
        return f"unknown key {loc[-1]!r}. Valid keys: {', '.join(valid)}"
    if kind == "missing":
        return "required, but missing"
    msg = str(item["msg"]).removeprefix("Value error, ")
    if kind in ("literal_error", "enum") or kind.endswith("_parsing") or kind.endswith("_type"):
        msg += f" (got {item['input']!r})"
    return msg


def _fields_at(loc: Loc) -> list[str]:
    """The field names of the model found at ``loc`` inside :class:`Scenario`."""
    model: type[BaseModel] = Scenario
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        nested = _model_of(field.annotation) if field else None
        if nested is None:
            return []
        model = nested
    return sorted(model.model_fields)


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None`` or ``list[X]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args: Iterable[object] = getattr(annotation, "__args__", ())
    for arg in args:
        found = _model_of(arg)
        if found is not None:
            return found
    return None
