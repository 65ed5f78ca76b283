"""``recover inject --fault FAULT --node NODE``: make a node's agent report a fault through its
real detection path (``POST /v1/inject`` with the admin token; see
:mod:`recovery.service.agents_api`), print the event id at once, and with ``--wait`` the
coordinator's decision on it.

Register with ``inject.register(app)`` in :mod:`recovery.cli`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from recovery.errors import RecoverError, UsageError
from recovery.service.client import Client


def inject(
    client: Client,
    *,
    fault: str,
    node: str,
    gpu: int | None = None,
    via: str = "agent",
    wait: bool = False,
    wait_timeout_s: float = 60.0,
    poll_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Ask the coordinator to have ``node``'s agent inject ``fault``; returns the reply
    (``event_id``, ``command``, ...), with ``decision`` added when ``wait``.

    Raises UsageError (unknown fault or node, agent not connected: the message says which and
    what is valid), AuthError, CoordinatorUnavailableError, RecoverError when the agent did not
    carry it out in time or ``wait`` sees no decision within ``wait_timeout_s`` seconds.
    """
    if via not in ("agent", "kmsg"):
        raise UsageError(f"Unknown path {via!r}. Known: agent, kmsg")
    body = {"fault": fault, "node": node, "gpu": gpu, "via": via}
    reply: dict[str, Any] = client.post("/v1/inject", body)
    if wait:
        reply["decision"] = wait_decision(
            client, reply.get("event_id"), wait_timeout_s, poll_s, sleep, monotonic
        )
    return reply


def wait_decision(
    client: Client,
    event_id: str | None,
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> dict[str, Any]:
    """Poll ``GET /v1/events/{id}/decision`` until the decision exists; returns it."""
    if not event_id:
        raise UsageError(
            "the agent could not tell the event id (kernel-log injection into /dev/kmsg); "
            "look for the injection marker with `recover incidents` instead of --wait"
        )
    deadline = monotonic() + timeout_s
    stored = False
    while True:
        doc = client.get(f"/v1/events/{event_id}/decision")
        stored = bool(doc.get("stored"))
        if doc.get("decision") is not None:
            decision: dict[str, Any] = doc["decision"]
            return decision
        if monotonic() >= deadline:
            raise RecoverError(
                f"no decision on event {event_id} within {timeout_s:g} s "
                f"({'it is in the journal' if stored else 'it has not reached the journal'})"
            )
        sleep(poll_s)


def render(reply: dict[str, Any]) -> str:
    """The text ``recover inject`` prints."""
    gpu = f" gpu {reply['gpu']}" if reply.get("gpu") is not None else ""
    out = [
        f"injected {reply['fault']} on {reply['node']}{gpu} via {reply['via']}: "
        f"event {reply.get('event_id') or '(id known once the agent reads /dev/kmsg)'} "
        f"(command {reply['command']})"
    ]
    decision = reply.get("decision")
    if decision:
        actions = ", ".join(a.get("kind", "?") for a in decision.get("actions", [])) or "none"
        held = " (held by the breaker)" if decision.get("held") else ""
        out.append(
            f"decision: {decision.get('verdict')}{held}; incident {decision.get('incident')}; "
            f"actions: {actions}; {decision.get('why', '')}"
        )
    return "\n".join(out)


def register(app: typer.Typer) -> None:
    """Add ``recover inject`` to ``app``."""

    @app.command("inject")
    def inject_cmd(
        fault: Annotated[str, typer.Option(help="A fault code from the catalogue, e.g. xid79.")],
        node: Annotated[str, typer.Option(help="The node whose agent reports it.")],
        gpu: Annotated[int | None, typer.Option(help="GPU index on the node.")] = None,
        via: Annotated[
            str, typer.Option(help="agent: through its pipeline; kmsg: a kernel-log line.")
        ] = "agent",
        wait: Annotated[bool, typer.Option(help="Wait for the coordinator's decision.")] = False,
        timeout: Annotated[float, typer.Option(help="--wait gives up after S s.")] = 60.0,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        coordinator: Annotated[str | None, typer.Option(help="The coordinator's URL.")] = None,
        token_file: Annotated[Path | None, typer.Option(help="The tokens file.")] = None,
        state_dir: Annotated[Path | None, typer.Option(help="The coordinator's state.")] = None,
    ) -> None:
        """Make NODE's agent detect FAULT as if it happened, through its real detection path."""
        reply = inject(
            Client.locate(coordinator, token_file, state_dir), fault=fault, node=node, gpu=gpu,
            via=via, wait=wait, wait_timeout_s=timeout,
        )  # fmt: skip
        typer.echo(json.dumps(reply, indent=2) if as_json else render(reply))
