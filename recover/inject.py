"""``recover inject --fault FAULT --node NODE``: make a node's agent report a fault through its
real detection path (``POST /v1/inject`` with the admin token; see
:mod:`service.httpapi.agents_api`), print the event id at once, and with ``--wait`` the
coordinator's decision on it once its Slurm actions are applied (or held, failed, waiting).

Register with ``inject.register(app)`` in :mod:`recover`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from recover.options import AsJson
from service.httpapi.client import Client, inject


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
        wait: Annotated[
            bool, typer.Option(help="Wait for the coordinator's decision and its Slurm actions.")
        ] = False,
        timeout: Annotated[float, typer.Option(help="--wait gives up after S s.")] = 60.0,
        as_json: AsJson = False,
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
