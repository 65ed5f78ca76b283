"""The service's Prometheus metrics, in a registry of its own (one per app, so tests and
several apps in one process never share counters)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Request latencies from sub-millisecond acks to a slow disk's multi-second commit.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# Events (or requests) per commit: 1 when idle, hundreds under load.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)


class ServiceMetrics:
    """Counters, histograms and scrape-time gauges of one app."""

    def __init__(self, open_incidents: Callable[[], float], held_actions: Callable[[], float]):
        """``open_incidents`` and ``held_actions`` are read at each scrape."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        events = Counter(
            "recover_intake_events", "Events received, by outcome", ["outcome"], registry=r
        )
        self.accepted = events.labels("accepted")
        self.duplicate = events.labels("duplicate")
        self.rejected = Counter(
            "recover_intake_rejected_requests",
            "Event requests rejected, by HTTP status",
            ["status"],
            registry=r,
        )
        self.latency = Histogram(
            "recover_http_request_duration_seconds",
            "Time from request start to response end, by route",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_events = Histogram(
            "recover_intake_commit_events",
            "Events per journal transaction (group commit)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.commit_requests = Histogram(
            "recover_intake_commit_requests",
            "Requests acknowledged per journal transaction (group commit)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        Gauge("recover_open_incidents", "Incidents not yet closed", registry=r).set_function(
            open_incidents
        )
        Gauge("recover_held_actions", "Actions the breaker holds", registry=r).set_function(
            held_actions
        )
        self._latency_children: dict[tuple[str, str], Any] = {}

    def observe_request(self, method: str, route: str, seconds: float) -> None:
        key = (method, route)
        child = self._latency_children.get(key)
        if child is None:  # label lookup costs more than the observation; cache it
            child = self._latency_children[key] = self.latency.labels(method, route)
        child.observe(seconds)


class LatencyMiddleware:
    """Pure ASGI middleware (no per-request task or body copy) timing every HTTP request by
    its route template (``/v1/incidents/{incident_id}``; ``unmatched`` for a 404 path)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                route = scope.get("route")
                path = getattr(route, "path", "unmatched")
                self.metrics.observe_request(scope["method"], path, time.perf_counter() - start)

        await self.app(scope, receive, timed_send)
