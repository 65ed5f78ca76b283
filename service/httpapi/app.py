"""The coordinator's HTTP API: durable event intake, reads, and the operator verbs.

Endpoints (every one but ``/healthz``, ``/readyz``, and ``/metrics`` unless configured, needs
``Authorization: Bearer <token>`` from the tokens file, see :mod:`service.httpapi.auth`):

* ``POST /v1/events`` - one HealthEvent or ``{"events": [...]}``; answered only once the
  events are committed to the journal (group commit, :mod:`service.httpapi.intake`);
* ``GET /v1/incidents[?open=true]``, ``GET /v1/incidents/{id}`` - from the journal;
* ``GET /v1/nodes``, ``GET /v1/status``, ``GET /v1/breaker`` - from the coordinator;
* ``POST /v1/nodes/{node}/repaired``, ``POST /v1/nodes/{node}/check``, ``POST
  /v1/breaker/reset`` - admin token only;
* ``GET /healthz``, ``GET /readyz`` (503 on a replica standing by), ``GET /metrics``
  (Prometheus text).

On a replica standing by (``serve --lease``), what needs the engine or the agents' channel
answers 503 naming the leader; events are committed as on the leader.
"""

# No ``from __future__ import annotations``: FastAPI reads the dependency annotations of the
# nested route functions at run time, and they name local objects (``Depends(caller)``).

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol, runtime_checkable

from fastapi import Body, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter

from recovery.coordinator.api import CoordinatorApi
from recovery.coordinator.leader import Deposed
from recovery.coordinator.replica import Role, standing_by
from recovery.errors import JournalError, TransientError, UsageError
from recovery.model import EventBatch, HealthEvent
from recovery.model.events import NODE_PATTERN
from recovery.ports.clock import Clock
from recovery.ports.journal import Journal, StoredEvent
from service.httpapi import models
from service.httpapi.agents_api import AgentChannel, agent_routes
from service.httpapi.auth import Principal, TokenTable
from service.httpapi.fastpath import ClientGone, EventIntake, ServiceApp
from service.httpapi.intake import GroupCommitter
from service.httpapi.metrics import LatencyMiddleware, ServiceMetrics
from service.httpapi.workmetrics import LeaderCollector, StateCollector, WorkMetrics

API_VERSION = "1"
_SCHEME = "bearer"
_JSON = "application/json"
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": models.ErrorReply, "description": "No token, or an unknown one"},
    403: {"model": models.ErrorReply, "description": "The token may not do this"},
    503: {"model": models.ErrorReply, "description": "The journal or coordinator failed"},
}


@runtime_checkable
class EventLookup(Protocol):
    """Journals that can fetch events by id (SqliteJournal); others are read via history."""

    def events_by_id(self, ids: Sequence[str]) -> list[StoredEvent]: ...


def _error(status: int, detail: Any, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def create_app(
    *,
    journal: Journal,
    tokens: TokenTable,
    coordinator: CoordinatorApi,
    clock: Clock,
    max_body_bytes: int = 1_000_000,
    metrics_need_token: bool = False,
    agents: AgentChannel | None = None,
    work: WorkMetrics | None = None,
    role: Callable[[], Role] | None = None,
) -> ServiceApp:
    """The API (a FastAPI app) over ``journal`` and ``coordinator``, authenticated by
    ``tokens``.

    ``max_body_bytes`` bounds an event request (413 above it). ``metrics_need_token``: whether
    ``/metrics`` asks for a token too (off by default: the server listens on loopback).
    ``agents``: the heartbeat tracker and command broker of the agent routes
    (:mod:`service.httpapi.agents_api`; a fresh one when None), also at ``app.state.agents``.
    ``work``: the coordinator's work metrics (those of the :class:`MeteredJournal` that
    ``journal`` should then be), exported at ``/metrics`` with what the coordinator has now.
    ``role``: this replica's standing when it is one of several
    (:mod:`recovery.coordinator.replica`): shown by ``/healthz``, exported as
    ``recover_leader`` and ``recover_leader_term``, and ``/readyz`` answers 503 while it
    stands by. The app owns one writer thread for group commit, stopped at lifespan shutdown.
    """
    metrics = ServiceMetrics(
        open_incidents=lambda: len(journal.incidents(open_only=True)),
        held_actions=lambda: len(journal.held_actions()),
    )
    if work is not None:
        work.register(metrics.registry)
        state = StateCollector(lambda: journal.incidents(open_only=True), coordinator.status)
        metrics.registry.register(state)

    def observe(events: int, requests: int) -> None:
        metrics.commit_events.observe(events)
        metrics.commit_requests.observe(requests)

    committer = GroupCommitter(journal, coordinator, clock, observe)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        committer.close()

    app = ServiceApp(
        title="recover coordinator",
        version=API_VERSION,
        lifespan=lifespan,
        separate_input_output_schemas=False,
        # FastAPI's built-in OpenTelemetry asks the global providers on every request; the
        # service exports Prometheus metrics instead.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    app.state.metrics = metrics
    bearer = HTTPBearer(auto_error=False, scheme_name=_SCHEME, description="tokens file entry")

    def caller(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        found = tokens.lookup(creds.credentials if creds else None)
        if found is None:
            raise HTTPException(
                401, "missing or unknown bearer token", headers={"WWW-Authenticate": "Bearer"}
            )
        return found

    def admin(who: Annotated[Principal, Depends(caller)]) -> Principal:
        if not who.admin:
            raise HTTPException(403, f"needs the admin token (this is node {who.node}'s)")
        return who

    _exception_handlers(app)
    app.intake = intake = EventIntake(tokens, committer, metrics, max_body_bytes)
    _intake_route(app, intake)
    _journal_routes(app, journal, caller)
    _coordinator_routes(app, coordinator, caller, admin)
    if role is not None:
        metrics.registry.register(LeaderCollector(role))
    _service_routes(app, journal, metrics, caller if metrics_need_token else None, role)
    app.state.agents = agents = agents or AgentChannel.default(clock)
    agent_routes(
        app, agents, journal=journal, tokens=tokens, caller=caller, admin=admin,
        leading=None if role is None else _leading(role),
    )  # fmt: skip
    _install_openapi(app)
    return app


def _leading(role: Callable[[], Role]) -> Callable[[], None]:
    """A dependency that refuses (NotLeader: 503) while this replica stands by."""

    def leading() -> None:
        r = role()
        if r.role != "leader":
            raise standing_by(r)

    return leading


def _exception_handlers(app: FastAPI) -> None:
    async def unavailable(_: Request, exc: Exception) -> Response:
        return _error(503, str(exc))

    async def bad_request(_: Request, exc: Exception) -> Response:
        return _error(400, str(exc))

    app.add_exception_handler(JournalError, unavailable)
    app.add_exception_handler(Deposed, unavailable)
    app.add_exception_handler(TransientError, unavailable)
    app.add_exception_handler(UsageError, bad_request)


def _intake_route(app: FastAPI, intake: EventIntake) -> None:
    responses: dict[int | str, dict[str, Any]] = {
        **_ERRORS,
        413: {"model": models.ErrorReply, "description": "Body over the size limit"},
        422: {"model": models.ValidationReply, "description": "Not a valid event or batch"},
    }

    # Served by ServiceApp's fast path; this route describes it in the OpenAPI document and
    # answers the same way should a request reach FastAPI's router.
    @app.post(
        "/v1/events",
        response_model=models.IntakeReply,
        responses=responses,
        openapi_extra={"security": [{_SCHEME: []}]},
        summary="Report health events (durable before acknowledged)",
    )
    async def post_events(request: Request) -> Response:
        try:
            status, body, headers = await intake.handle(request.scope, request.receive)
        except ClientGone:
            return Response(status_code=400)  # nobody is left to read it
        return Response(
            body,
            status,
            headers={k.decode(): v.decode() for k, v in headers if k != b"content-type"},
            media_type=_JSON,
        )


def _journal_routes(app: FastAPI, journal: Journal, caller: Any) -> None:
    auth = [Depends(caller)]

    @app.get(
        "/v1/incidents",
        response_model=list[models.IncidentOut],
        responses=_ERRORS,
        dependencies=auth,
    )
    def list_incidents(
        open_only: Annotated[bool, Query(alias="open", description="only open ones")] = False,
    ) -> list[models.IncidentOut]:
        return [models.incident_out(r) for r in journal.incidents(open_only=open_only)]

    @app.get(
        "/v1/incidents/{incident_id}",
        response_model=models.IncidentDetail,
        responses={**_ERRORS, 404: {"model": models.ErrorReply}},
        dependencies=auth,
    )
    def get_incident(incident_id: str) -> models.IncidentDetail:
        try:
            record = journal.incident(incident_id)
        except UsageError as e:
            raise HTTPException(404, str(e)) from e
        if isinstance(journal, EventLookup):
            events = journal.events_by_id(record.event_ids)
        else:
            wanted = set(record.event_ids)
            events = [s for s, _ in journal.history() if s.event.id in wanted]
        return models.incident_detail(record, events)


def _coordinator_routes(app: FastAPI, coordinator: CoordinatorApi, caller: Any, admin: Any) -> None:
    auth, admin_only = [Depends(caller)], [Depends(admin)]
    err404 = {**_ERRORS, 400: {"model": models.ErrorReply}, 404: {"model": models.ErrorReply}}

    @app.get("/v1/nodes", response_model=list[dict[str, Any]], responses=_ERRORS, dependencies=auth)
    def nodes() -> list[dict[str, Any]]:
        return coordinator.nodes()

    @app.get("/v1/status", response_model=dict[str, Any], responses=_ERRORS, dependencies=auth)
    def status() -> dict[str, Any]:
        return coordinator.status()

    @app.get("/v1/breaker", response_model=dict[str, Any], responses=_ERRORS, dependencies=auth)
    def breaker() -> dict[str, Any]:
        return coordinator.breaker()

    @app.post(
        "/v1/nodes/{node}/repaired",
        response_model=dict[str, Any],
        responses=err404,
        dependencies=admin_only,
    )
    def repaired(node: Annotated[str, Path(pattern=NODE_PATTERN)]) -> dict[str, Any]:
        try:
            return coordinator.repaired(node)
        except UsageError as e:
            known = {str(n.get("name")) for n in coordinator.nodes()}
            raise HTTPException(400 if node in known else 404, str(e)) from e

    @app.post(
        "/v1/nodes/{node}/check",
        response_model=dict[str, Any],
        responses={**err404, 409: {"model": models.ErrorReply}},
        dependencies=admin_only,
    )
    def check(
        node: Annotated[str, Path(pattern=NODE_PATTERN)],
        body: Annotated[models.CheckRequest | None, Body()] = None,
    ) -> dict[str, Any]:
        # A plain def: FastAPI runs it on a worker thread, so a burn-in of seconds blocks
        # no other request.
        ask = body or models.CheckRequest()
        try:
            return coordinator.check_node(node, burn_in=ask.burn_in, force=ask.force)
        except UsageError as e:
            known = {str(n.get("name")) for n in coordinator.nodes()}
            status = 404 if node not in known else 409 if "busy" in str(e) else 400
            raise HTTPException(status, str(e)) from e

    @app.get(
        "/v1/nodes/{node}/check",
        response_model=dict[str, Any],
        responses=err404,
        dependencies=auth,
    )
    def look(node: Annotated[str, Path(pattern=NODE_PATTERN)]) -> dict[str, Any]:
        # Any token: it only reads (a job supervisor asks it about its job's spares).
        try:
            return coordinator.look_at_node(node)
        except UsageError as e:
            raise HTTPException(404, str(e)) from e

    @app.post(
        "/v1/breaker/reset",
        response_model=dict[str, Any],
        responses={**_ERRORS, 400: {"model": models.ErrorReply}},
        dependencies=admin_only,
    )
    def breaker_reset() -> dict[str, Any]:
        try:
            return coordinator.breaker_reset()
        except UsageError as e:
            raise HTTPException(400, str(e)) from e


def _service_routes(
    app: FastAPI,
    journal: Journal,
    metrics: ServiceMetrics,
    caller: Any | None,
    role: Callable[[], Role] | None,
) -> None:
    def health() -> models.Health:
        journal.get_meta("schema")  # a JournalError here answers 503
        if role is None:
            return models.Health()
        r = role()
        return models.Health(
            role="leader" if r.role == "leader" else "standby",
            replica=r.identity,
            leader=r.holder,
            term=r.term,
        )

    @app.get(
        "/healthz",
        response_model=models.Health,
        response_model_exclude_none=True,
        responses={503: {"model": models.ErrorReply}},
    )
    def healthz() -> models.Health:
        """Alive, with the journal readable: a liveness probe (a standby is healthy)."""
        return health()

    @app.get("/readyz", response_model=models.Health, responses={503: {"model": models.ErrorReply}})
    def readyz() -> Response:
        """Ready to act: the only coordinator, or the leader; 503 while a replica stands by
        (for whatever must reach the leader alone; as a readiness probe it would keep a
        disruption budget from ever evicting the leader, docs/coordinator.md)."""
        h = health()
        status = 503 if h.role == "standby" else 200
        return JSONResponse(h.model_dump(exclude_none=True), status_code=status)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
        dependencies=[Depends(caller)] if caller is not None else [],
    )
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _install_openapi(app: FastAPI) -> None:
    """The generated document, with the hand-read ``POST /v1/events`` body described."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                routes=app.routes,
                separate_input_output_schemas=False,
            )
            body = TypeAdapter(HealthEvent | EventBatch).json_schema(
                ref_template="#/components/schemas/{model}"
            )
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in body.pop("$defs", {}).items():
                schemas.setdefault(name, schema)
            doc["paths"]["/v1/events"]["post"]["requestBody"] = {
                "required": True,
                "content": {_JSON: {"schema": body}},
            }
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
