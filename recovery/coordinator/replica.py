"""One coordinator replica of several: the HTTP API answers on every replica, the engine runs
only on the one that leads (:mod:`recovery.coordinator.leader`).

* **Leading**: the election thread starts an engine (built fresh, so it rebuilds its state
  from the journal and finishes what the last leader planned, as a restart does). Every Slurm
  and Kubernetes action the engine takes is fenced (:mod:`recovery.coordinator.fenced`): once
  the lease may have passed to another replica, the action is not done.
* **Standing by**: events posted here are committed to the shared journal and answered
  (``submit`` has nothing to wake: the leader's engine decides every undecided event on its
  next tick). What needs the engine (status, nodes, operator commands) answers
  :class:`NotLeader`, which the HTTP API turns into 503 naming the leader; clients move on to
  the next replica they know.
* **Deposed** (the lease lost or not renewed in time): the engine is stopped; what it started
  and did not finish is still planned in the journal, and the next leader finishes it.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from recovery.coordinator.api import CoordinatorApi
from recovery.coordinator.leader import Elector, Standing
from recovery.errors import TransientError
from recovery.model import HealthEvent


class NotLeader(TransientError):
    """This replica stands by: ask the leader (the message names it)."""


def standing_by(r: Role) -> NotLeader:
    """The refusal of a replica that does not lead, naming the one that does."""
    who = f"{r.holder} leads" if r.holder and r.holder != r.identity else "no leader yet"
    return NotLeader(
        f"coordinator replica {r.identity} stands by ({who}); "
        "ask the leader (another replica in --coordinator's list)"
    )


class Running(CoordinatorApi, Protocol):
    """An engine that runs while this replica leads."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = 10.0) -> None: ...


@dataclass(frozen=True)
class Role:
    """What ``/healthz`` and ``/metrics`` say about this replica."""

    role: str
    """``leader`` or ``standby``."""
    identity: str
    holder: str
    """The leader as last seen ("" when none)."""
    term: int


class Replica:
    """The coordinator API of one replica (implements CoordinatorApi). ``start_engine`` builds
    and starts the engine (and whatever runs beside it) when this replica becomes leader;
    ``on_change`` hears every change of role (logged, and the leader writes its endpoint)."""

    def __init__(
        self,
        elector: Elector,
        start_engine: Callable[[], Running],
        *,
        log: Callable[[str], None],
        on_change: Callable[[Role], None] = lambda _: None,
    ) -> None:
        self._elector = elector
        self._start_engine = start_engine
        self._log = log
        self._on_change = on_change
        self._engine: Running | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = Standing(False, "", 0, False, "not started")

    # --- the election loop ----------------------------------------------------------------

    def start(self) -> None:
        """Run the election until :meth:`stop` (the first round before returning)."""
        self._round()
        self._thread = threading.Thread(target=self._run, name="recover-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine and give the lease up, so that a standby leads at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        self._stop_engine("shutting down")
        self._elector.release()

    def _run(self) -> None:
        while not self._stop.wait(self._elector.retry_s):
            self._round()

    def _round(self) -> None:
        try:
            self.tick()
        except Exception:  # the election must outlive any one bad round; it is logged
            self._log("coordinator: election round failed:\n" + traceback.format_exc())

    def tick(self) -> Standing:
        """One round of the election, and the engine started or stopped to match."""
        standing = self._elector.tick()
        self._last = standing
        if standing.changed:
            self._log(f"coordinator: {standing.detail}")
        if standing.leading and self._engine is None:
            engine = self._start_engine()
            with self._lock:
                self._engine = engine
            engine.start()
            self._on_change(self.role())
        elif not standing.leading and self._engine is not None:
            self._stop_engine(standing.detail)
            self._on_change(self.role())
        return standing

    def _stop_engine(self, why: str) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            self._log(f"coordinator: engine stopped ({why})")
            engine.stop()

    def role(self) -> Role:
        s = self._last
        leading = self._engine is not None and self._elector.may_act()
        holder = self._elector.identity if leading else s.holder
        return Role("leader" if leading else "standby", self._elector.identity, holder, s.term)

    # --- CoordinatorApi -------------------------------------------------------------------

    def _leader(self) -> Running:
        engine = self._engine
        if engine is None or not self._elector.may_act():
            raise standing_by(self.role())
        return engine

    def submit(self, events: Sequence[HealthEvent]) -> None:
        engine = self._engine
        if engine is not None:
            engine.submit(events)
        # Standing by: the events are in the shared journal; the leader decides them.

    def nodes(self) -> list[dict[str, Any]]:
        return self._leader().nodes()

    def status(self) -> dict[str, Any]:
        return self._leader().status()

    def repaired(self, node: str) -> dict[str, Any]:
        return self._leader().repaired(node)

    def check_node(
        self, node: str, *, burn_in: bool | None = None, force: str | None = None
    ) -> dict[str, Any]:
        return self._leader().check_node(node, burn_in=burn_in, force=force)

    def look_at_node(self, node: str) -> dict[str, Any]:
        return self._leader().look_at_node(node)

    def breaker(self) -> dict[str, Any]:
        return self._leader().breaker()

    def breaker_reset(self) -> dict[str, Any]:
        return self._leader().breaker_reset()
