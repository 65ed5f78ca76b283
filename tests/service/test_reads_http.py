"""The read API and the operator verbs through a real server: tokens, journal contents,
coordinator errors as 400/404, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.ports.clock import FakeClock
from recovery.ports.journal import ActionStatus, Phase, PhaseName
from tests.service.helpers import (
    ADMIN_TOKEN,
    NODE_TOKENS,
    Api,
    auth,
    event,
    replace_decision,
    running_api,
)

ADMIN, N1 = auth(ADMIN_TOKEN), auth(NODE_TOKENS["n1"])
READS = [
    "/v1/incidents",
    "/v1/incidents?open=true",
    "/v1/nodes",
    "/v1/status",
    "/v1/breaker",
    "/v1/nodes/n1/check",
]


def _incident(api: Api, i: int, *, held: bool = False) -> str:
    clock = FakeClock()
    ev = event(i)
    api.journal.append_events([ev], clock.now())
    api.journal.record_decision(replace_decision(ev, f"inc-{i}", held=held), clock.now())
    return f"inc-{i}"


@pytest.mark.parametrize("path", [*READS, "/v1/incidents/inc-1"])
def test_reads_need_a_token(api: Api, path: str) -> None:
    _incident(api, 1)
    assert api.client.get(path).status_code == 401
    assert api.client.get(path, headers=auth("z" * 30)).status_code == 401
    assert api.client.get(path, headers=N1).status_code == 200
    assert api.client.get(path, headers=ADMIN).status_code == 200


def test_incidents_from_the_journal(api: Api) -> None:
    one, two = _incident(api, 1), _incident(api, 2, held=True)
    clock = FakeClock()
    api.journal.add_phase(one, Phase(PhaseName.node_down, clock.advance(2), "DOWN"))
    down = api.journal.pending_actions()[0]
    api.journal.record_outcome(down.id, ActionStatus.done, clock.advance(1), detail="ok")
    api.journal.close_incident(two, clock.advance(5))

    listed = api.client.get("/v1/incidents", headers=ADMIN).json()
    assert [i["id"] for i in listed] == [one, two]
    assert [i["id"] for i in api.client.get("/v1/incidents?open=true", headers=N1).json()] == [one]

    detail = api.client.get(f"/v1/incidents/{one}", headers=ADMIN).json()
    assert (detail["node"], detail["verdict"], detail["status"]) == ("n1", "replace", "open")
    assert [p["name"] for p in detail["phases"]] == ["decided", "node-down"]
    assert [(a["kind"], a["status"]) for a in detail["actions"]] == [
        ("down", "done"),
        ("promote", "planned"),
    ]
    assert detail["actions"][0]["action"] == {
        "kind": "down",
        "node": "n1",
        "reason": "recover: xid79",
    }
    assert [e["event"]["id"] for e in detail["events"]] == ["ev-1"]
    assert detail["events"][0]["decided"] is True


def test_unknown_incident_is_404(api: Api) -> None:
    r = api.client.get("/v1/incidents/inc-404", headers=ADMIN)
    assert r.status_code == 404
    assert "Unknown incident 'inc-404'" in r.json()["detail"]


def test_coordinator_reads(api: Api) -> None:
    nodes = api.client.get("/v1/nodes", headers=N1).json()
    assert [n["name"] for n in nodes] == ["n1", "n2", "n3"]
    status = api.client.get("/v1/status", headers=N1).json()
    assert ([n["name"] for n in status["nodes"]], status["dry_run"]) == (["n1", "n2", "n3"], False)
    assert api.client.get("/v1/breaker", headers=N1).json()["window_s"] == 300
    assert api.client.get("/v1/nodes/n2/check", headers=N1).json()["verdict"] == "passed"
    unknown = api.client.get("/v1/nodes/n9/check", headers=N1)
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == "Unknown node 'n9'. Known: n1, n2, n3"


@pytest.mark.parametrize(
    ("path", "status", "detail"),
    [
        ("/v1/nodes/n1/repaired", 200, None),
        ("/v1/nodes/n2/repaired", 400, "node n2 was not taken out by us"),
        ("/v1/nodes/n9/repaired", 404, "Unknown node 'n9'. Known: n1, n2, n3"),
        ("/v1/breaker/reset", 200, None),
    ],
)
def test_operator_verbs(api: Api, path: str, status: int, detail: str | None) -> None:
    assert api.client.post(path).status_code == 401
    denied = api.client.post(path, headers=N1)
    assert denied.status_code == 403
    assert "needs the admin token" in denied.json()["detail"]
    r = api.client.post(path, headers=ADMIN)
    assert r.status_code == status, r.text
    if detail is not None:
        assert r.json()["detail"] == detail


def test_health_and_metrics_need_no_token(api: Api) -> None:
    _incident(api, 1)
    _incident(api, 2, held=True)
    assert api.client.get("/healthz").json() == {"status": "ok", "role": "single"}
    assert api.client.get("/readyz").json() == {"status": "ok", "role": "single"}
    api.client.get("/v1/incidents/inc-1", headers=ADMIN)
    text = api.client.get("/metrics").text
    assert "recover_open_incidents 2.0" in text
    assert "recover_held_actions 2.0" in text
    route = 'method="GET",route="/v1/incidents/{incident_id}"'
    assert f"recover_http_request_duration_seconds_count{{{route}}} 1.0" in text


def test_metrics_can_require_a_token(tmp_path: Path) -> None:
    with running_api(tmp_path, metrics_need_token=True) as api:
        assert api.client.get("/metrics").status_code == 401
        assert api.client.get("/metrics", headers=N1).status_code == 200
