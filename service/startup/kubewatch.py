"""Kubernetes node readiness as a source of health events: a thread that watches the nodes and
puts a ``node-unreachable`` event into the journal for each one turning NotReady or Unknown,
the same intake agent events go through (committed, then the engine woken).

The events' ids are derived from the node and its Ready transition
(:func:`recovery.coordinator.kube.unready_event`), so a watch that starts again, or a
restarted coordinator, sees the outage it recorded already as a duplicate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from recovery.coordinator.kube import unready_event
from recovery.errors import RecoverError, TransientError
from recovery.model import HealthEvent
from recovery.ports.clock import Clock
from recovery.ports.journal import Journal
from recovery.ports.nodes import NodeControl


class NodeWatch:
    """Runs :meth:`NodeControl.watch` on its own thread until :meth:`stop`.

    ``known()`` names the Slurm nodes: a Kubernetes node that runs no Slurm node (a control
    plane node) is no business of ours. ``submit`` wakes the engine (``Engine.submit``).
    After an error the watch starts again ``retry_s`` seconds later.
    """

    def __init__(
        self,
        *,
        nodes: NodeControl,
        journal: Journal,
        clock: Clock,
        known: Callable[[], set[str]],
        submit: Callable[[list[HealthEvent]], None],
        log: Callable[[str], None] = lambda _msg: None,
        retry_s: float = 2.0,
    ) -> None:
        self.nodes = nodes
        self.journal = journal
        self.clock = clock
        self.known = known
        self.submit = submit
        self.log = log
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="recover-k8s-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Ask the watch to end (it notices within the watch's timeout) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        # Until the engine has read Slurm once there is no telling which nodes are ours; the
        # watch's first listing must not be thrown away for that.
        while not self.known() and not self._stop.wait(0.1):
            pass
        while not self._stop.is_set():
            try:
                for node in self.nodes.watch(self._stop.is_set):
                    self.offer(unready_event(node, self.clock.now().wall))
            except TransientError as e:
                self.log(f"kubernetes watch: {e}; watching again in {self.retry_s:g} s")
            except RecoverError as e:
                self.log(f"kubernetes watch stopped by a refusal: {e}; trying again")
            self._stop.wait(self.retry_s)

    def offer(self, event: HealthEvent | None) -> bool:
        """Journal ``event`` if it concerns a Slurm node and is new; True when it was."""
        if event is None or event.node not in self.known():
            return False
        (new,) = self.journal.append_events([event], self.clock.now())
        if new:
            self.log(f"kubernetes: {event.message}")
            self.submit([event])
        return new
