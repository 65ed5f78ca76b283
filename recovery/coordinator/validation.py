"""Checking a node before work lands on it (``recover node check``, and the coordinator's own
checks): gathers the facts :mod:`recovery.pool.validate` judges, runs the burn-in, journals
the verdict.

A check runs on the caller's thread (an HTTP request's) or on the validator's own thread
(:meth:`Validator.run`: the checks the executor asked for before a promotion, and the
background re-checks of spares), never on the engine's worker: a burn-in takes seconds. A
node is claimed (:class:`NodeClaims`) for its burn-in; the executor claims a spare before
promoting it, so a spare being burned in is not promoted under the check, and a spare being
promoted is not burned in.

What a verdict does to Slurm is the engine's (its reconcile step ``validation``, on the worker
thread): a spare whose last check failed is held with ``recover: check failed: <check>: ...``,
and a node so held whose last check passed goes back to the pool.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from recovery.coordinator.leader import Deposed
from recovery.errors import TransientError, UsageError, unknown_choice
from recovery.pool.spares import SPARE_REASON, is_spare
from recovery.pool.validate import (
    Accelerators,
    CheckResult,
    NodeCheck,
    NodeFacts,
    ValidationSettings,
    cheap_checks,
    fresh_pass,
    plan,
)
from recovery.ports.checks import BurnIn
from recovery.ports.clock import Clock
from recovery.ports.journal import Journal
from recovery.ports.slurm import NodeInfo

#: Journal meta key of a node's last check (JSON of :meth:`NodeCheck.to_json`).
CHECK_KEY = "node_check:"
#: Journal meta key of a node in a burn-in now: the reason it goes back out with (so that a
#: coordinator killed mid-burn-in puts it back as it was).
BURNING_KEY = "node_burning:"
#: Journal meta key of when an operator last said a node was repaired (wall seconds).
REPAIRED_KEY = "node_repaired:"
#: Earlier verdicts kept beside the last one.
HISTORY = 10


class AgentReports(Protocol):
    """What the agents said of their nodes (the HTTP API's heartbeat tracker)."""

    def last_seen(self, node: str) -> float | None:
        """Monotonic seconds of ``node``'s last heartbeat, None if it never beat."""
        ...

    def accelerators(self, node: str) -> Mapping[str, Any] | None:
        """The accelerators ``node``'s agent last reported, None if it reported none."""
        ...


class NodeClaims:
    """Nodes something is doing to now (a burn-in, a promotion): one at a time per node.
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}

    def claim(self, node: str, what: str) -> str | None:
        """Claim ``node`` for ``what``; None when claimed, else what holds it."""
        with self._lock:
            holder = self._held.get(node)
            if holder is None:
                self._held[node] = what
            return holder

    def release(self, node: str) -> None:
        with self._lock:
            self._held.pop(node, None)

    def holder(self, node: str) -> str | None:
        with self._lock:
            return self._held.get(node)


@dataclass(frozen=True)
class Outcome:
    """A check the validator's thread ran: for ``incident`` (a promotion waiting on it), or
    ``""`` (a background re-check)."""

    check: NodeCheck
    incident: str = ""


class Validator:
    """Checks nodes and keeps their verdicts in the journal."""

    def __init__(
        self,
        *,
        journal: Journal,
        clock: Clock,
        agents: AgentReports | None,
        burn_in: BurnIn | None,
        settings: ValidationSettings,
        claims: NodeClaims,
        nodes: Callable[[], Sequence[NodeInfo]],
        log: Callable[[str], None] = print,
    ) -> None:
        """``nodes``: the Slurm nodes as the engine last read them."""
        self._journal = journal
        self._clock = clock
        self._agents = agents
        self._burn_in = burn_in
        self.settings = settings
        self.claims = claims
        self._nodes = nodes
        self._log = log
        self._lock = threading.Lock()
        self._cache: dict[str, NodeCheck | None] = {}
        self._requested: dict[str, str] = {}
        """Nodes whose check was asked for (-> the incident asking), not run yet."""
        self._outcomes: list[Outcome] = []
        self._wake = threading.Event()

    # --- verdicts kept ----------------------------------------------------------------

    def last(self, node: str) -> NodeCheck | None:
        """``node``'s last check, None when it never had one (read once from the journal,
        then kept)."""
        with self._lock:
            if node in self._cache:
                return self._cache[node]
        doc = self._doc(node)
        check = NodeCheck.from_json(doc["last"]) if doc else None
        with self._lock:
            self._cache.setdefault(node, check)
            return self._cache[node]

    def history(self, node: str) -> list[dict[str, Any]]:
        """``node``'s earlier verdicts (``at``, ``verdict``), oldest first."""
        doc = self._doc(node)
        return list(doc.get("earlier", [])) if doc else []

    def _doc(self, node: str) -> dict[str, Any] | None:
        raw = self._journal.get_meta(CHECK_KEY + node)
        if not raw:
            return None
        doc: dict[str, Any] = json.loads(raw)
        return doc

    def _keep(self, check: NodeCheck) -> None:
        earlier = self.history(check.node)
        before = self.last(check.node)
        if before is not None:
            earlier = [*earlier, {"at": before.at, "verdict": before.verdict}][-HISTORY:]
        doc = {"last": check.to_json(), "earlier": earlier}
        self._journal.set_meta(CHECK_KEY + check.node, json.dumps(doc, sort_keys=True))
        with self._lock:
            self._cache[check.node] = check

    # --- checking ---------------------------------------------------------------------

    def facts(self, node: str, excuse: Sequence[str] = ()) -> NodeFacts:
        """What the checks judge of ``node`` now (the open incidents in ``excuse`` not
        counted)."""
        now = self._clock.now()
        seen = self._agents.last_seen(node) if self._agents is not None else None
        reported = self._agents.accelerators(node) if self._agents is not None else None
        incidents = tuple(
            i.id
            for i in self._journal.incidents(open_only=True)
            if i.node == node and i.id not in excuse
        )
        return NodeFacts(
            node=node,
            heartbeat_age_s=None if seen is None else max(0.0, now.mono - seen),
            open_incidents=incidents,
            accelerators=Accelerators.from_json(reported),
            previous=self.last(node),
            repaired_at=self.repaired_at(node),
        )

    def repaired_at(self, node: str) -> float | None:
        """When an operator last said ``node`` was repaired (wall seconds), None if never."""
        raw = self._journal.get_meta(REPAIRED_KEY + node)
        return float(raw) if raw else None

    def note_repaired(self, node: str, at: float) -> None:
        """An operator said ``node`` is repaired at ``at``: the accelerator faults its agent
        saw before then are what was repaired, not held against its next check."""
        self._journal.set_meta(REPAIRED_KEY + node, repr(at))

    def check(
        self, node: str, *, burn_in: bool | None = None, excuse: Sequence[str] = ()
    ) -> NodeCheck:
        """Check ``node`` now and journal the verdict. ``burn_in`` None: as the settings say.
        The burn-in runs only on a node out of service (a spare, or one we took out); an
        in-service node's jobs are its burn-in. ``excuse``: open incidents that do not count
        against it (those of the fault a repair answers). UsageError for an unknown node, or
        one being burned in or promoted right now."""
        info = self._node(node)
        steps = plan(self.facts(node, excuse), self.settings, burn_in=burn_in)
        results = list(steps.results)
        if steps.burn_in:
            results.append(self._run_burn_in(info))
        now = self._clock.now().wall
        burned = next((r.ok for r in results if r.name == "burn-in"), None)
        previous = self.last(node)
        burned_at = (
            now if burned else
            previous.burned_at if burned is None and previous is not None else None
        )  # fmt: skip
        check = NodeCheck(node, now, tuple(results), standing=_standing(info), burned_at=burned_at)
        self._keep(check)
        self._log(f"validation: {node} {check.verdict} in {check.took_s:.1f} s")
        return check

    def look(self, node: str) -> NodeCheck:
        """The cheap checks of ``node`` (agent, incidents, accelerators) as its facts stand
        now, neither journaled nor counted as its last check (a job supervisor's question
        about a spare of its job: it runs the burn-in itself, inside its allocation).
        UsageError for an unknown node."""
        info = self._node(node)
        results = cheap_checks(self.facts(node), self.settings)
        return NodeCheck(node, self._clock.now().wall, tuple(results), standing=_standing(info))

    def force(self, node: str, why: str) -> NodeCheck:
        """An operator vouches for ``node``: a passing verdict, journaled as forced."""
        self._node(node)
        if not why.strip():
            raise UsageError("a forced check needs the operator's reason (--force REASON)")
        check = NodeCheck(
            node, self._clock.now().wall,
            (CheckResult("forced", True, f"forced by an operator: {why.strip()}"),),
            forced=why.strip(), standing=_standing(self._node(node)),
        )  # fmt: skip
        self._keep(check)
        self._log(f"validation: {node} forced ({why.strip()})")
        return check

    def rows(self, nodes: Sequence[NodeInfo]) -> list[dict[str, Any]]:
        """Each node's last check, for ``recover status`` (never checked: verdict None)."""
        now = self._clock.now().wall
        rows = []
        for n in nodes:
            last = self.last(n.name)
            bad = last.failed if last is not None else None
            rows.append({
                "node": n.name,
                "spare": is_spare(n),
                "verdict": None if last is None else last.verdict,
                "age_s": None if last is None else round(now - last.at, 1),
                "took_s": None if last is None else last.took_s,
                "detail": bad.detail if bad is not None else "",
            })  # fmt: skip
        return rows

    # --- the gate before work lands, and the validator's thread -------------------------

    def gate(self, node: str, incident: str) -> tuple[str | None, bool]:
        """Whether ``node`` may take work now (the executor asks before promoting it):
        ``(None, False)`` when validation is not required or its last check passed within
        ``max_age_s``; else why it waits, and whether a check was asked for just now (the
        validator's thread runs it; the waiting promotion tries again after)."""
        if not self.settings.required:
            return None, False
        if self.fresh(node):
            return None, False
        if self.claims.holder(node) == "burn-in":
            return f"{node} is being checked", False
        last = self.last(node)
        if last is not None and not last.passed and self._clock.now().wall - last.at < 60:
            # Just failed: the engine holds it out, and the policy chooses another.
            return f"{node} failed its check ({last.verdict}); choosing another spare", False
        asked = self.request(node, incident)
        had = "no check" if last is None else f"its last check {last.verdict}"
        return (
            f"{node} has {had} within {self.settings.max_age_s:g} s; checking it before it "
            "takes work"
        ), asked

    def fresh(self, node: str) -> bool:
        """``node``'s last check passed within ``max_age_s``, and so did a burn-in where the
        policy has them (and a runner is there)."""
        burned = self.settings.burn_in and self._burn_in is not None
        return fresh_pass(
            self.last(node), self._clock.now().wall, self.settings.max_age_s, burned=burned
        )

    def request(self, node: str, incident: str = "") -> bool:
        """Ask the validator's thread to check ``node``; False when it was asked already."""
        with self._lock:
            if node in self._requested:
                return False
            self._requested[node] = incident
        self._wake.set()
        return True

    def busy(self, node: str) -> bool:
        """``node``'s check is asked for or running."""
        with self._lock:
            asked = node in self._requested
        return asked or self.claims.holder(node) == "burn-in"

    def take_outcomes(self) -> list[Outcome]:
        """The checks the validator's thread ran since the last call (the engine records
        them in their incidents)."""
        with self._lock:
            out, self._outcomes = self._outcomes, []
        return out

    def run(self, stop: threading.Event) -> None:
        """The validator's thread: put back any node a killed coordinator left in a burn-in,
        then run the checks asked for, and re-check each spare every ``recheck_s``. Ends
        when this replica is deposed (its engine is being stopped)."""
        try:
            self._run(stop)
        except Deposed as e:
            self._log(f"validation: {e}")

    def _run(self, stop: threading.Event) -> None:
        if self._burn_in is not None:
            try:
                left = {n.name: self._journal.get_meta(BURNING_KEY + n.name) for n in self._nodes()}
                restore = {n: r for n, r in left.items() if r}
                for node in self._burn_in.cleanup(restore):
                    self._log(f"validation: {node} was left in a burn-in; put back out")
                for node in restore:
                    self._journal.set_meta(BURNING_KEY + node, "")
            except TransientError as e:
                self._log(f"validation: cannot look for burn-ins left behind: {e}")
        while not stop.is_set():
            self._wake.clear()
            try:
                ran = self.run_once()
            except TransientError as e:
                self._log(f"validation: {e}; trying again")
                stop.wait(2.0)
                continue
            if not ran:
                self._wake.wait(1.0)

    def run_once(self) -> bool:
        """Run the next check asked for (else a re-check that is due), on this thread;
        False when there was none. TransientError (Slurm unreachable) leaves it asked for."""
        job = self._next()
        if job is None:
            return False
        node, incident, burn_in = job
        check: NodeCheck | None
        try:
            check = self.check(node, burn_in=burn_in)
        except UsageError as e:  # gone from Slurm, or busy: a waiting promotion asks again
            self._log(f"validation: {node}: {e}")
            check = None
        with self._lock:
            self._requested.pop(node, None)
            if check is not None:
                self._outcomes.append(Outcome(check, incident))
        return True

    def _next(self) -> tuple[str, str, bool | None] | None:
        """The next check to run: ``(node, incident asking, burn_in)``; a check asked for
        first (as the policy says), else a spare's re-check that is due: the cheap checks,
        and the burn-in only when the last one passed would be older than ``max_age_s``
        before the next re-check."""
        with self._lock:
            if self._requested:
                node = next(iter(self._requested))
                return node, self._requested[node], None
        every = self.settings.recheck_s
        if every <= 0:
            return None
        now = self._clock.now().wall
        for n in self._nodes():
            if not is_spare(n) or self.claims.holder(n.name) is not None:
                continue
            last = self.last(n.name)
            if last is None or now - last.at >= every:
                burned_at = last.burned_at if last is not None else None
                stale = burned_at is None or now - burned_at >= self.settings.max_age_s - every
                return n.name, "", None if stale else False
        return None

    def _node(self, node: str) -> NodeInfo:
        nodes = {n.name: n for n in self._nodes()}
        if node not in nodes:
            raise unknown_choice("node", node, sorted(nodes))
        return nodes[node]

    def _run_burn_in(self, info: NodeInfo) -> CheckResult:
        if self._burn_in is None:
            return CheckResult("burn-in", None, "skipped: no burn-in runner (not on Slurm)")
        if info.in_service:
            return CheckResult(
                "burn-in", None, "skipped: the node is in service (its jobs are its burn-in)"
            )
        if info.held_by_other:
            return CheckResult(
                "burn-in", None,
                f"skipped: someone else holds the node out ({info.reason!r}, set by "
                f"{info.reason_set_by or '?'})",
            )  # fmt: skip
        holder = self.claims.claim(info.name, "burn-in")
        if holder is not None:
            raise UsageError(f"{info.name} is busy ({holder}); check it again in a moment")
        restore = info.reason or SPARE_REASON  # it goes back out as it was
        peer = self._claim_peer(info.name)
        try:
            self._journal.set_meta(BURNING_KEY + info.name, restore)
            if peer is not None:
                self._journal.set_meta(BURNING_KEY + peer[0], peer[1])
            outcome = self._burn_in.run(
                info.name, self.settings.burn_in_budget_s, restore, self.settings.accelerators,
                peer,
            )  # fmt: skip
            self._journal.set_meta(BURNING_KEY + info.name, "")
            if peer is not None:
                self._journal.set_meta(BURNING_KEY + peer[0], "")
        finally:
            self.claims.release(info.name)
            if peer is not None:
                self.claims.release(peer[0])
        detail = outcome.detail
        if peer is None and outcome.ok:
            detail += " (no healthy peer out of service: the collective ran within the node)"
        return CheckResult("burn-in", outcome.ok, detail, round(outcome.took_s, 3))

    def _claim_peer(self, node: str) -> tuple[str, str] | None:
        """A healthy node for the burn-in's collective, claimed: a spare other than ``node``
        whose last check (and burn-in) passed within ``max_age_s`` and that nothing holds
        now; with its reason. None when there is none."""
        for n in self._nodes():
            if n.name == node or not is_spare(n) or n.held_by_other:
                continue
            now = self._clock.now().wall
            if not fresh_pass(self.last(n.name), now, self.settings.max_age_s, burned=True):
                continue
            if self.claims.claim(n.name, f"burn-in peer of {node}") is None:
                return n.name, n.reason or SPARE_REASON
        return None


def _standing(node: NodeInfo) -> str:
    if is_spare(node):
        return "spare"
    return "in service" if node.in_service else "out of service"
