"""Validating a node before work lands on it: the checks, their verdict, and whether a verdict
is fresh enough to trust.

A node is checked in order, cheapest first, and a failed cheap check skips the costly ones
(a node whose agent is dead is not worth a burn-in job):

* ``agent``: its agent's last heartbeat is recent (a dead agent would miss the node's next
  fault);
* ``incidents``: no open incident names it;
* ``accelerators``: what its agent last reported of its accelerators is sane: the expected
  count, none lost, no failed row remap or pending page retirement, no accelerator fault
  since the previous check;
* ``burn-in``: a short real job on the node (a matrix product checked against its known
  result and a collective), within a time budget.

Pure: the caller gathers the facts (:class:`NodeFacts`) and runs the burn-in; this module
judges them. A verdict is kept with its time (:class:`NodeCheck`) and trusted for
``max_age_s`` (:func:`fresh_pass`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from recovery.ports.slurm import OWNER_PREFIX

#: The checks, in the order they run.
CHECKS = ("agent", "incidents", "accelerators", "burn-in")
#: The reason a node that failed a check is held with: ``recover: check failed: <check>``.
CHECK_FAILED_PREFIX = f"{OWNER_PREFIX} check failed:"

CheckName = Literal["agent", "incidents", "accelerators", "burn-in"]


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``ok`` None when it was skipped (``detail`` says why)."""

    name: str
    ok: bool | None
    detail: str
    took_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "took_s": self.took_s}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CheckResult:
        return cls(str(doc["name"]), doc.get("ok"), str(doc.get("detail", "")),
                   float(doc.get("took_s", 0.0)))  # fmt: skip


@dataclass(frozen=True)
class NodeCheck:
    """A node's check: when it ended (wall seconds), each check's result, and whether an
    operator forced the verdict (``forced``: the operator's words)."""

    node: str
    at: float
    results: tuple[CheckResult, ...]
    forced: str = ""
    standing: str = ""
    """What the node was when checked: ``spare``, ``in service`` or ``out of service``."""
    burned_at: float | None = None
    """When the node last passed a burn-in (wall seconds): this check's, or the previous
    check's carried over by a check that ran none (a cheap background re-check)."""

    @property
    def passed(self) -> bool:
        """Every check that ran passed (a forced check passes whatever ran), and the burn-in
        ran unless the caller chose to skip it."""
        if self.forced:
            return True
        return all(r.ok is not False for r in self.results) and any(r.ok for r in self.results)

    @property
    def failed(self) -> CheckResult | None:
        """The first check that failed, None when none did."""
        return next((r for r in self.results if r.ok is False), None)

    @property
    def took_s(self) -> float:
        return round(sum(r.took_s for r in self.results), 3)

    @property
    def verdict(self) -> str:
        """``passed``, ``forced`` or ``failed: <check>``."""
        if self.forced:
            return "forced"
        bad = self.failed
        return "passed" if bad is None and self.passed else f"failed: {bad.name if bad else '?'}"

    def hold_reason(self) -> str:
        """The Slurm reason a node that failed is held with: names the check and its words
        (Slurm keeps reasons short; the detail is cut)."""
        bad = self.failed
        if bad is None:
            return f"{CHECK_FAILED_PREFIX} none"
        detail = bad.detail if len(bad.detail) <= 120 else bad.detail[:117] + "..."
        return f"{CHECK_FAILED_PREFIX} {bad.name}: {detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "at": self.at,
            "verdict": self.verdict,
            "passed": self.passed,
            "took_s": self.took_s,
            "forced": self.forced,
            "standing": self.standing,
            "burned_at": self.burned_at,
            "results": [r.to_json() for r in self.results],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> NodeCheck:
        return cls(
            node=str(doc["node"]),
            at=float(doc["at"]),
            results=tuple(CheckResult.from_json(r) for r in doc.get("results", ())),
            forced=str(doc.get("forced", "")),
            standing=str(doc.get("standing", "")),
            burned_at=float(doc["burned_at"]) if doc.get("burned_at") is not None else None,
        )


def fresh_pass(
    check: NodeCheck | None, now: float, max_age_s: float, *, burned: bool = False
) -> bool:
    """``check`` passed and ended no more than ``max_age_s`` seconds before ``now``; with
    ``burned``, the node also passed a burn-in within ``max_age_s`` (a forced verdict counts:
    the operator vouches for the node)."""
    if check is None or not check.passed or not 0 <= now - check.at <= max_age_s:
        return False
    if not burned or check.forced:
        return True
    return check.burned_at is not None and 0 <= now - check.burned_at <= max_age_s


@dataclass(frozen=True)
class Accelerators:
    """What a node's agent last reported of its accelerators (its heartbeat's
    ``accelerators``). ``devices`` None: the agent does not know (no NVML, no TPU runtime)."""

    source: str = "none"
    devices: int | None = None
    lost: tuple[int, ...] = ()
    remap_failed: tuple[int, ...] = ()
    retirement_pending: tuple[int, ...] = ()
    faults: int = 0
    """Accelerator faults the agent reported since it started."""
    last_fault: str = ""
    last_fault_at: float | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> Accelerators | None:
        if not isinstance(doc, Mapping):
            return None

        def ints(key: str) -> tuple[int, ...]:
            value = doc.get(key) or ()
            return tuple(int(v) for v in value) if isinstance(value, Sequence) else ()

        devices = doc.get("devices")
        at = doc.get("last_fault_at")
        return cls(
            source=str(doc.get("source", "none")),
            devices=int(devices) if isinstance(devices, int) else None,
            lost=ints("lost"),
            remap_failed=ints("remap_failed"),
            retirement_pending=ints("retirement_pending"),
            faults=int(doc.get("faults", 0) or 0),
            last_fault=str(doc.get("last_fault", "")),
            last_fault_at=float(at) if isinstance(at, int | float) else None,
        )


@dataclass(frozen=True)
class NodeFacts:
    """What the checks judge, gathered by the caller at one moment.

    ``heartbeat_age_s``: seconds since the node's agent last beat (None: never heard of);
    ``open_incidents``: ids of the open incidents naming the node; ``accelerators``: its
    agent's last report (None: the agent sent none); ``previous``: the node's last check;
    ``repaired_at``: when an operator last said it was repaired (wall seconds; an
    accelerator fault before that is what was repaired)."""

    node: str
    heartbeat_age_s: float | None
    open_incidents: tuple[str, ...] = ()
    accelerators: Accelerators | None = None
    previous: NodeCheck | None = None
    repaired_at: float | None = None


@dataclass(frozen=True)
class ValidationSettings:
    """How nodes are validated (the policy file's ``validation`` section)."""

    agent_max_age_s: float = 20.0
    """An agent whose last heartbeat is older than this fails the ``agent`` check (the
    engine's own suspect threshold by default)."""
    accelerators: int | None = None
    """Accelerators each node must show (None: any count, each of them sane)."""
    max_age_s: float = 600.0
    """A passing check is trusted this long: a node is promoted or returned to the pool on
    it without a new one."""
    burn_in: bool = True
    """Run the burn-in job (the costly check). Off: the cheap checks only."""
    burn_in_budget_s: float = 60.0
    """The burn-in must finish within this (its job is cancelled past it: failed)."""
    required: bool = False
    """Only nodes with a fresh passing check are promoted or returned to the pool. Off: a
    check is run and shown when asked for (``recover node check``), never waited on."""
    recheck_s: float = 0.0
    """Re-check every spare this often in the background (0: never): the cheap checks, and
    the burn-in only when the last one passed would otherwise grow older than ``max_age_s``
    before the next re-check (the spare leaves the pool only for those)."""

    def __post_init__(self) -> None:
        for name in ("agent_max_age_s", "max_age_s", "burn_in_budget_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"validation.{name} must be > 0 (got {getattr(self, name)!r})")
        if self.recheck_s < 0:
            raise ValueError(f"validation.recheck_s must be >= 0 (got {self.recheck_s!r})")
        if self.accelerators is not None and self.accelerators < 0:
            raise ValueError(f"validation.accelerators must be >= 0 (got {self.accelerators!r})")


def judge_agent(facts: NodeFacts, settings: ValidationSettings) -> CheckResult:
    age = facts.heartbeat_age_s
    if age is None:
        return CheckResult("agent", False, "its agent never sent a heartbeat")
    if age > settings.agent_max_age_s:
        return CheckResult(
            "agent", False,
            f"its agent's last heartbeat is {age:.1f} s old (at most "
            f"{settings.agent_max_age_s:g} s)",
        )  # fmt: skip
    return CheckResult("agent", True, f"heartbeat {age:.1f} s ago")


def judge_incidents(facts: NodeFacts) -> CheckResult:
    if facts.open_incidents:
        return CheckResult(
            "incidents", False, f"open incident(s) on it: {', '.join(facts.open_incidents)}"
        )
    return CheckResult("incidents", True, "no open incident")


def judge_accelerators(facts: NodeFacts, settings: ValidationSettings) -> CheckResult:
    acc = facts.accelerators
    want = settings.accelerators
    if acc is None:
        if want:
            return CheckResult(
                "accelerators", False,
                f"its agent reported no accelerators ({want} expected)",
            )  # fmt: skip
        return CheckResult("accelerators", True, "none reported, none expected")
    problems: list[str] = []
    if want is not None and acc.devices != want:
        seen = "an unknown number" if acc.devices is None else str(acc.devices)
        problems.append(f"{seen} device(s), {want} expected")
    for key, words in (
        ("lost", "lost (fallen off the bus)"),
        ("remap_failed", "with a failed row remap"),
        ("retirement_pending", "with a page retirement pending"),
    ):
        bad: tuple[int, ...] = getattr(acc, key)
        if bad:
            problems.append(f"device(s) {', '.join(map(str, bad))} {words}")
    marks = [
        (facts.previous.at, "since its last check") if facts.previous is not None else None,
        (facts.repaired_at, "since it was repaired") if facts.repaired_at is not None else None,
    ]
    since, when = max(
        (m for m in marks if m is not None), default=(None, "since its agent started")
    )
    if acc.last_fault_at is not None and (since is None or acc.last_fault_at > since):
        problems.append(f"an accelerator fault {when} ({acc.last_fault or 'unnamed'})")
    if problems:
        return CheckResult("accelerators", False, "; ".join(problems))
    count = "?" if acc.devices is None else str(acc.devices)
    return CheckResult("accelerators", True, f"{count} device(s) via {acc.source}, all sane")


def cheap_checks(facts: NodeFacts, settings: ValidationSettings) -> list[CheckResult]:
    """The checks that only judge facts, in order."""
    return [
        judge_agent(facts, settings),
        judge_incidents(facts),
        judge_accelerators(facts, settings),
    ]


@dataclass
class Plan:
    """What a check of one node does next: ``burn_in`` whether to run the burn-in job."""

    results: list[CheckResult] = field(default_factory=list)
    burn_in: bool = False


def plan(facts: NodeFacts, settings: ValidationSettings, *, burn_in: bool | None = None) -> Plan:
    """The cheap checks' results and whether the burn-in follows (not after a failed cheap
    check; ``burn_in`` overrides the settings)."""
    results = cheap_checks(facts, settings)
    wanted = settings.burn_in if burn_in is None else burn_in
    failed = any(r.ok is False for r in results)
    if failed:
        results.append(CheckResult("burn-in", None, "skipped: a cheaper check failed"))
    elif not wanted:
        results.append(CheckResult("burn-in", None, "skipped: not asked for"))
    return Plan(results, burn_in=wanted and not failed)
