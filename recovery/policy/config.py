"""The policy's settings: frozen dataclasses with every unit stated, read from one YAML file.

Example file (every key optional)::

    verdicts: {xid13: ignore, xid94: drain-reset}
    correlation_window_s: 30
    flood_window_s: 300
    escalation_window_s: 3600
    flapping: {threshold: 3, window_s: 86400}
    breaker: {window_s: 300, max_fraction: 0.5, max_nodes: 10, hold_max_age_s: 900}
    save_timeout_s: 60
    spares: {groups: {node1: rack-a, node2: rack-a}, feature_prefix: "rack-"}
    requeue: {window_s: 120, budget: 3, budget_window_s: 3600}
    progress: {floor_s: 30, straggler: {factor: 2.0}}
    validation: {required: true, max_age_s: 600, accelerators: 8, burn_in_budget_s: 60,
                 recheck_s: 300, agent_max_age_s: 20, burn_in: true}
    dry_run: false
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from recovery.errors import UsageError, unknown_choice
from recovery.model import Verdict
from recovery.policy._files import (
    PolicyFileError,
    boolean,
    check_keys,
    integer,
    load_yaml_mapping,
    number,
    one_line,
    require_mapping,
)
from recovery.policy.catalogue import Catalogue, load_catalogue, parse_verdict
from recovery.policy.requeue import RequeueConfig
from recovery.pool.validate import ValidationSettings
from recovery.progress import Budgets


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class FlappingConfig:
    """When a node counts as flapping."""

    threshold: int = 3
    """Failures (incidents opened) within ``window_s`` that make a node flapping; a flapping
    node is replaced and is not returned to the spare pool after repair."""
    window_s: float = 86_400.0
    """Length of the window, in seconds."""


@dataclass(frozen=True)
class BreakerConfig:
    """The blast-radius limit on take-outs (drain-reset or replace), per sliding window."""

    window_s: float = 300.0
    """Length of the sliding window, in seconds."""
    max_fraction: float = 0.5
    """Most of a partition's nodes (spares not counted) taken out per window, as a fraction
    0-1. At least one node per partition may always be taken out."""
    max_nodes: int = 10
    """Most nodes taken out per window across the cluster, as a count."""
    hold_max_age_s: float = 900.0
    """Held decisions older than this many seconds at a breaker reset expire instead of
    being applied (replaying days-old events does harm)."""


@dataclass(frozen=True)
class SpareTopology:
    """How to prefer a spare close to the failed node (same rack or NVLink domain)."""

    groups: Mapping[str, str] = field(default_factory=_empty)
    """Node name -> group name. Wins over node features."""
    feature_prefix: str | None = None
    """When set, a Slurm node feature starting with this prefix names the node's group."""


@dataclass(frozen=True)
class RepairCheck:
    """A command that says whether a node we took out is healthy again (exit 0: repaired).

    ``command`` is an argv; ``{node}`` in any item is replaced by the node's name. It runs
    every ``interval_s`` seconds for each node we hold out, with ``timeout_s`` seconds to
    answer (a timeout counts as not repaired)."""

    command: tuple[str, ...]
    interval_s: float = 60.0
    timeout_s: float = 30.0


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the policy's behaviour depends on besides the catalogue."""

    verdicts: Mapping[str, Verdict] = field(default_factory=_empty)
    """Per-fault verdict overrides (fault code -> verdict); they win over the catalogue."""
    correlation_window_s: float = 30.0
    """Seconds within which companion faults (XID 48 with 63/64) join one incident."""
    flood_window_s: float = 300.0
    """Seconds within which repeats of one fault on one node are one incident."""
    escalation_window_s: float = 3600.0
    """Seconds after a failure within which a new failure of the node escalates its verdict
    (restart-app -> drain-reset -> replace)."""
    flapping: FlappingConfig = field(default_factory=FlappingConfig)
    """When a node is flapping."""
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    """The circuit breaker's window and limits."""
    save_timeout_s: float = 60.0
    """Seconds the jobs get to checkpoint and leave before they are requeued anyway."""
    spares: SpareTopology = field(default_factory=SpareTopology)
    """Spare choice by topology."""
    dry_run: bool = False
    """Decide and record, but let the executor apply nothing."""
    repair_check: RepairCheck | None = None
    """A passing check returns a node to the pool as `recover node repaired` would; None:
    only an operator does."""
    requeue: RequeueConfig = field(default_factory=RequeueConfig)
    """Which jobs that ended on a node taken out for a fault the coordinator requeues."""
    progress: Mapping[str, Any] = field(default_factory=_empty)
    """The site's thresholds for judging jobs' progress (stall budgets and the straggler
    rule, the keys of ``$RECOVER_STALL_BUDGETS``): the agents take them from their
    heartbeats as their defaults; a job's own budgets go over them."""
    validation: ValidationSettings = field(default_factory=ValidationSettings)
    """How nodes are checked before work lands on them (``recover node check``)."""

    @classmethod
    def default(cls) -> PolicyConfig:
        """The settings used when no policy file is given."""
        return cls()

    def fingerprint(self) -> str:
        """8 hex digits that change whenever any setting changes (recorded in decisions)."""
        return self._fingerprint

    @cached_property
    def _fingerprint(self) -> str:
        # Computed once per (immutable) config: decide records it on every decision.
        text = json.dumps(_plain(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


def _plain(value: object) -> object:
    """JSON-ready copy of a config value (dataclasses and read-only mappings included)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_TOP = (
    "verdicts",
    "correlation_window_s",
    "flood_window_s",
    "escalation_window_s",
    "flapping",
    "breaker",
    "save_timeout_s",
    "spares",
    "dry_run",
    "repair_check",
    "requeue",
    "progress",
    "validation",
)


def load_policy_config(path: Path | None, *, catalogue: Catalogue | None = None) -> PolicyConfig:
    """Read the policy file at ``path``; None gives :meth:`PolicyConfig.default`.

    Override keys are checked against ``catalogue`` (the packaged one when None). Raises
    :class:`recovery.policy.PolicyFileError` (a UsageError) for an unreadable file, an unknown
    key (naming it and the valid keys), an unknown fault (listing the known ones), an unknown
    verdict or an out-of-range number.
    """
    if path is None:
        return PolicyConfig.default()
    data = load_yaml_mapping(path)
    where = str(path)
    check_keys(data, where, _TOP)
    d = PolicyConfig()
    return PolicyConfig(
        verdicts=_verdicts(data.get("verdicts", {}), f"{where}: verdicts", catalogue),
        correlation_window_s=_seconds(data, "correlation_window_s", d.correlation_window_s, where),
        flood_window_s=_seconds(data, "flood_window_s", d.flood_window_s, where),
        escalation_window_s=_seconds(data, "escalation_window_s", d.escalation_window_s, where),
        flapping=_flapping(data.get("flapping", {}), f"{where}: flapping"),
        breaker=_breaker(data.get("breaker", {}), f"{where}: breaker"),
        save_timeout_s=_seconds(data, "save_timeout_s", d.save_timeout_s, where),
        spares=_spares(data.get("spares", {}), f"{where}: spares"),
        dry_run=boolean(data.get("dry_run", False), f"{where}: dry_run"),
        repair_check=_repair_check(data.get("repair_check"), f"{where}: repair_check"),
        requeue=_requeue(data.get("requeue", {}), f"{where}: requeue"),
        progress=_progress(data.get("progress", {}), f"{where}: progress"),
        validation=_validation(data.get("validation", {}), f"{where}: validation"),
    )


def _validation(raw: object, where: str) -> ValidationSettings:
    data = require_mapping(raw, where)
    d = ValidationSettings()
    check_keys(data, where, tuple(f.name for f in fields(d)))

    def seconds(key: str, *, strict: bool = True) -> float:
        return number(data.get(key, getattr(d, key)), f"{where}: {key}", strict=strict)

    count = data.get("accelerators")
    return ValidationSettings(
        agent_max_age_s=seconds("agent_max_age_s"),
        accelerators=None if count is None else integer(count, f"{where}: accelerators"),
        max_age_s=seconds("max_age_s"),
        burn_in=boolean(data.get("burn_in", d.burn_in), f"{where}: burn_in"),
        burn_in_budget_s=seconds("burn_in_budget_s"),
        required=boolean(data.get("required", d.required), f"{where}: required"),
        recheck_s=seconds("recheck_s", strict=False),
    )


def _progress(raw: object, where: str) -> Mapping[str, Any]:
    """The site's progress thresholds, checked as a job's would be (a UsageError naming the
    valid keys becomes a PolicyFileError)."""
    data = require_mapping(raw, where)
    try:
        Budgets().overridden(data, where)
    except UsageError as e:
        said = str(e)
        raise PolicyFileError(said if said.startswith(where) else f"{where}: {said}") from None
    return MappingProxyType(json.loads(json.dumps(data)))


def _requeue(raw: object, where: str) -> RequeueConfig:
    data = require_mapping(raw, where)
    check_keys(data, where, ("window_s", "budget", "budget_window_s"))
    d = RequeueConfig()
    return RequeueConfig(
        window_s=number(data.get("window_s", d.window_s), f"{where}: window_s"),
        budget=integer(data.get("budget", d.budget), f"{where}: budget"),
        budget_window_s=number(
            data.get("budget_window_s", d.budget_window_s),
            f"{where}: budget_window_s",
            strict=True,
        ),
    )


def _repair_check(raw: object, where: str) -> RepairCheck | None:
    if raw is None:
        return None
    data = require_mapping(raw, where)
    check_keys(data, where, ("command", "interval_s", "timeout_s"))
    command = data.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise PolicyFileError(
            f"{where}: command: expected a list of strings (an argv, '{{node}}' for the node), "
            f"e.g. [/usr/local/bin/gpu-check, '{{node}}']; got {command!r}"
        )
    d = RepairCheck(("true",))
    return RepairCheck(
        command=tuple(command),
        interval_s=number(
            data.get("interval_s", d.interval_s), f"{where}: interval_s", strict=True
        ),
        timeout_s=number(data.get("timeout_s", d.timeout_s), f"{where}: timeout_s", strict=True),
    )


def _seconds(data: Mapping[str, Any], key: str, default: float, where: str) -> float:
    return number(data.get(key, default), f"{where}: {key}")


def _verdicts(raw: object, where: str, catalogue: Catalogue | None) -> Mapping[str, Verdict]:
    data = require_mapping(raw, where)
    cat = catalogue or load_catalogue()
    out: dict[str, Verdict] = {}
    for fault, value in data.items():
        if cat.lookup(fault) is None:
            raise PolicyFileError(f"{where}: {unknown_choice('fault', fault, cat.known())}")
        out[fault] = parse_verdict(value, f"{where}: {fault}")
    return MappingProxyType(out)


def _flapping(raw: object, where: str) -> FlappingConfig:
    data = require_mapping(raw, where)
    check_keys(data, where, ("threshold", "window_s"))
    d = FlappingConfig()
    return FlappingConfig(
        threshold=integer(data.get("threshold", d.threshold), f"{where}: threshold", minimum=1),
        window_s=number(data.get("window_s", d.window_s), f"{where}: window_s"),
    )


def _breaker(raw: object, where: str) -> BreakerConfig:
    data = require_mapping(raw, where)
    check_keys(data, where, ("window_s", "max_fraction", "max_nodes", "hold_max_age_s"))
    d = BreakerConfig()
    fraction = number(data.get("max_fraction", d.max_fraction), f"{where}: max_fraction")
    if fraction > 1:
        raise PolicyFileError(f"{where}: max_fraction: expected a fraction 0-1, got {fraction:g}")
    return BreakerConfig(
        window_s=number(data.get("window_s", d.window_s), f"{where}: window_s"),
        max_fraction=fraction,
        max_nodes=integer(data.get("max_nodes", d.max_nodes), f"{where}: max_nodes", minimum=1),
        hold_max_age_s=number(
            data.get("hold_max_age_s", d.hold_max_age_s), f"{where}: hold_max_age_s"
        ),
    )


def _spares(raw: object, where: str) -> SpareTopology:
    data = require_mapping(raw, where)
    check_keys(data, where, ("groups", "feature_prefix"))
    groups = require_mapping(data.get("groups", {}), f"{where}: groups")
    clean = {node: one_line(g, f"{where}: groups: {node}") for node, g in groups.items()}
    prefix = data.get("feature_prefix")
    return SpareTopology(
        groups=MappingProxyType(clean),
        feature_prefix=None if prefix is None else one_line(prefix, f"{where}: feature_prefix"),
    )
