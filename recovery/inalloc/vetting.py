"""Checking the spares a job holds before its supervisor puts work on them.

A spare inside the allocation is idle until a relaunch lands on it, so nothing it runs would
reveal a dead agent or a broken accelerator before the job's training does. The supervisor
checks each spare of its job (:class:`SpareCheck`: the coordinator's cheap checks of its
agent, incidents and accelerators, asked read-only, then a burn-in step of the job on the
node) on a thread of its own, started a few seconds into each launch, and keeps the
verdicts. A relaunch takes only spares that pass: the cheap checks asked again at that
moment (milliseconds: an agent may have died since), with the burn-in of the background
check when it passed within ``max_age_s``, else a burn-in then, on the relaunch's path
(seconds). A spare that failed is not tried again in this job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from recovery.pool.validate import CheckResult, NodeCheck

#: Default age (seconds) past which a spare's passing check no longer lets work land on it:
#: the coordinator's ``validation.max_age_s``.
DEFAULT_MAX_AGE_S = 600.0


class SpareCheck(Protocol):
    """Checks one node of the job."""

    def check(self, node: str, *, burn_in: bool) -> NodeCheck:
        """The verdict on ``node``, with its burn-in step (seconds) or without it (the
        cheap checks only); never raises for what the node did (that is the verdict), nor
        for a coordinator that does not answer (a check it could not make)."""


class Vetting:
    """The verdicts on a job's spares, checked on one background thread at a time.

    ``journal(event, **fields)`` is told each verdict (``spare-checked``); ``wall`` stamps
    them (Unix seconds, as the checks do)."""

    def __init__(
        self,
        check: SpareCheck,
        journal: Callable[..., None],
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._check = check
        self._journal = journal
        self.max_age_s = max_age_s
        self._wall = wall
        self._lock = threading.Lock()
        self._verdicts: dict[str, NodeCheck] = {}
        self._thread: threading.Thread | None = None
        self._round_nodes: tuple[str, ...] = ()

    def last(self, node: str) -> NodeCheck | None:
        with self._lock:
            return self._verdicts.get(node)

    def due(self, node: str) -> bool:
        """No passing burn-in of ``node`` within ``max_age_s`` (a failed verdict stands:
        the node is not tried again in this job)."""
        last = self.last(node)
        if last is None:
            return True
        return last.passed and not self._burned_fresh(last)

    def _burned_fresh(self, check: NodeCheck) -> bool:
        at = check.burned_at
        return at is not None and self._wall() - at < self.max_age_s

    def start(self, nodes: Iterable[str]) -> list[str]:
        """Check, in the background and in order, each of ``nodes`` that is due; the nodes
        it will check (none while an earlier round still runs)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return []
        todo = [n for n in nodes if self.due(n)]
        if not todo:
            return []
        self._thread = threading.Thread(
            target=self._round, args=(todo,), name="spare-checks", daemon=True
        )
        self._thread.start()
        return todo

    def verdict(self, node: str) -> NodeCheck:
        """The verdict a relaunch goes by (waiting for the background round when it is
        checking ``node``): a failed one stands; after a burn-in that passed within
        ``max_age_s``, the cheap checks asked again now with it; else a whole check now."""
        thread = self._thread
        if thread is not None and thread.is_alive() and node in self._round_nodes:
            thread.join()
        last = self.last(node)
        if last is not None and not last.passed:
            return last
        return self._one(node, background=False, burn_in=self.due(node))

    def failed(self) -> list[NodeCheck]:
        """The failed verdicts so far."""
        with self._lock:
            return [c for c in self._verdicts.values() if not c.passed]

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the background round (tests; the job's end)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    # --- checking ---------------------------------------------------------------------

    def _round(self, nodes: Sequence[str]) -> None:
        self._round_nodes = tuple(nodes)
        try:
            for node in nodes:
                self._one(node, background=True, burn_in=True)
        finally:
            self._round_nodes = ()

    def _one(self, node: str, *, background: bool, burn_in: bool) -> NodeCheck:
        start = self._wall()
        last = self.last(node)
        try:
            check = self._check.check(node, burn_in=burn_in)
        except Exception as e:  # a bug or an unreachable Slurm: the node is not vouched for
            failed = CheckResult("check", False, f"the check itself failed: {e}")
            check = NodeCheck(node, self._wall(), (failed,), standing="job spare")
        if burn_in:
            burned = next((r.ok for r in check.results if r.name == "burn-in"), None)
            check = replace(check, burned_at=check.at if burned else None)
        elif last is not None and last.burned_at is not None and check.failed is None:
            # The cheap checks now, with the burn-in that passed earlier.
            age = check.at - last.burned_at
            kept = CheckResult(
                "burn-in", True, f"passed {age:.0f} s ago (within {self.max_age_s:g} s)"
            )
            results = (*(r for r in check.results if r.name != "burn-in"), kept)
            check = replace(check, results=results, burned_at=last.burned_at)
        with self._lock:
            self._verdicts[node] = check
        self._journal(
            "spare-checked",
            node=node,
            verdict=check.verdict,
            took_s=round(self._wall() - start, 3),
            background=background,
            burn_in=burn_in,
            checks=[r.to_json() for r in check.results],
        )
        return check
