"""Operator verbs that talk to a running coordinator: ``recover status``, ``recover incidents``,
``recover node repaired|check``, ``recover breaker status|reset``. Thin: parse, call, print."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from recover.options import AsJson
from recover.render import (
    render_breaker,
    render_check,
    render_incident,
    render_incidents,
    render_status,
)

Url = Annotated[
    str | None,
    typer.Option(
        "--coordinator",
        envvar="RECOVER_COORDINATOR",
        help="Coordinator URL, or the replicas' URLs comma-separated [default: the one "
        "recorded in the state dir].",
    ),
]
TokenFile = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="RECOVER_TOKEN_FILE",
        help="Tokens file with the admin token [default: STATE_DIR/tokens].",
    ),
]
StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="The coordinator's state dir [default: $RECOVER_STATE_DIR/coordinator or "
        "./.state/coordinator].",
    ),
]

node_app = typer.Typer(help="Tell the coordinator about a node.", no_args_is_help=True)
breaker_app = typer.Typer(help="Show or release the blast-radius breaker.", no_args_is_help=True)


def _client(url: str | None, token_file: Path | None, state_dir: Path | None) -> Any:
    from service.httpapi.client import Client

    return Client.locate(url, token_file, state_dir)


def _print(doc: Any, as_json: bool, render: Any) -> None:
    typer.echo(json.dumps(doc, indent=2) if as_json else render(doc))


def status(
    url: Url = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Nodes, open incidents, spares and the breaker, as the coordinator sees them."""
    _print(_client(url, token_file, state_dir).get("/v1/status"), as_json, render_status)


def incidents(
    incident: Annotated[str | None, typer.Argument(help="One incident's id: its timeline.")] = None,
    open_only: Annotated[bool, typer.Option("--open", help="Only open incidents.")] = False,
    url: Url = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """List incidents, or show one incident's timeline (phases, actions, events)."""
    client = _client(url, token_file, state_dir)
    if incident:
        _print(client.get(f"/v1/incidents/{incident}"), as_json, render_incident)
        return
    path = "/v1/incidents?open=true" if open_only else "/v1/incidents"
    _print(client.get(path), as_json, render_incidents)


@node_app.command("repaired")
def repaired(
    node: Annotated[str, typer.Argument(help="The node that was repaired.")],
    url: Url = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """A node we took out is repaired: return it to the spare pool (refused while flapping,
    and, where the policy requires validation, until it passes its check)."""
    client = replace(_client(url, token_file, state_dir), timeout_s=CHECK_TIMEOUT_S)
    doc = client.post(f"/v1/nodes/{node}/repaired")
    _print(doc, as_json, lambda d: f"{d['node']}: {d['result']}")


#: How long a command that may run a node's burn-in waits for the coordinator (the burn-in's
#: own budget is the policy's ``validation.burn_in_budget_s``).
CHECK_TIMEOUT_S = 600.0


@node_app.command("check")
def check(
    node: Annotated[str, typer.Argument(help="The node to check.")],
    burn_in: Annotated[
        bool | None,
        typer.Option(
            "--burn-in/--no-burn-in",
            help="Run the burn-in job on a node out of service, or not (the cheap checks "
            "only) [default: as the policy's validation.burn_in says].",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        str | None,
        typer.Option(
            "--force",
            metavar="REASON",
            help="Check nothing: record a passing verdict, marked forced, with your reason "
            "(a node you vouch for may then be promoted or returned to the pool).",
        ),
    ] = None,
    url: Url = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Check a node before work lands on it: its agent's heartbeat, its open incidents, its
    accelerators, and (out of service only) a short burn-in job on it. Exits 1 when it fails.
    The verdict is journaled: `recover status` shows each spare's last one, and a spare that
    fails is held out with the failed check as its reason."""
    client = replace(_client(url, token_file, state_dir), timeout_s=CHECK_TIMEOUT_S)
    body: dict[str, Any] = {"force": force} if force is not None else {"burn_in": burn_in}
    doc = client.post(f"/v1/nodes/{node}/check", body)
    _print(doc, as_json, render_check)
    if not doc.get("passed"):
        raise typer.Exit(1)


@breaker_app.command("status")
def breaker_status(
    url: Url = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Window, limits, nodes taken out in the window, and the actions held."""
    _print(_client(url, token_file, state_dir).get("/v1/breaker"), as_json, render_breaker)


@breaker_app.command("reset")
def breaker_reset(
    url: Url = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Release the held actions (those older than the hold age expire instead)."""
    doc = _client(url, token_file, state_dir).post("/v1/breaker/reset")
    _print(
        doc,
        as_json,
        lambda d: f"released {len(d['released'])} held action(s); expired {len(d['expired'])}",
    )


def register(root: typer.Typer) -> None:
    """Attach the operator verbs to the ``recover`` CLI."""
    root.command("status")(status)
    root.command("incidents")(incidents)
    root.add_typer(node_app, name="node")
    root.add_typer(breaker_app, name="breaker")
