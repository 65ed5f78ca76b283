"""The agent's own metrics (``recover agent run --metrics-listen HOST:PORT``): what it
detected by source, what waits in its spool, and how long ago it last delivered events and
last had a heartbeat answered. A registry of its own, served by prometheus_client's HTTP
server on a thread. prometheus_client (the agent extra has it) is imported only when metrics
are asked for: ``recover`` imports the agent's modules in every install, the training one
too."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Reported while something never happened (no delivery, no heartbeat answer yet).
NEVER = float("nan")


class AgentMetrics:
    """``spooled``: events waiting in the spool now; ``last_post`` and ``last_beat``: when
    (monotonic seconds) events were last delivered and a heartbeat last answered, None when
    never. All read at each scrape."""

    def __init__(
        self,
        spooled: Callable[[], int],
        last_post: Callable[[], float | None],
        last_beat: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.detected = Counter(
            "recover_agent_events_detected",
            "Fault events detected, by source (before folding repeats)",
            ["source"],
            registry=r,
        )
        Gauge(
            "recover_agent_spool_events", "Events in the spool, not yet delivered", registry=r
        ).set_function(lambda: float(spooled()))

        def age(of: Callable[[], float | None]) -> Callable[[], float]:
            def read() -> float:
                at = of()
                return NEVER if at is None else max(0.0, clock() - at)

            return read

        Gauge(
            "recover_agent_last_post_age_seconds",
            "Seconds since events were last delivered to the coordinator (NaN: never)",
            registry=r,
        ).set_function(age(last_post))
        Gauge(
            "recover_agent_heartbeat_age_seconds",
            "Seconds since the coordinator last answered a heartbeat (NaN: never)",
            registry=r,
        ).set_function(age(last_beat))

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=self.registry)
