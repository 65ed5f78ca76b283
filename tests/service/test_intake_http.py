"""POST /v1/events through a real uvicorn server on loopback: every rejection leaves nothing
behind, acknowledged events are in the journal, duplicates are acknowledged and stored once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.service.helpers import ADMIN_TOKEN, NODE_TOKENS, Api, auth, event_json

N1 = auth(NODE_TOKENS["n1"])
ADMIN = auth(ADMIN_TOKEN)


def _bad_fault() -> dict[str, Any]:
    return {**event_json(1), "fault": "XID 79"}


def _chunks(total: int) -> Iterator[bytes]:  # no Content-Length: sent chunked
    for _ in range(total // 1000):
        yield b" " * 1000


@pytest.mark.parametrize(
    ("kwargs", "status", "detail"),
    [
        ({"json": event_json(1)}, 401, "missing or unknown bearer token"),
        ({"json": event_json(1), "headers": auth("x" * 20)}, 401, "unknown bearer token"),
        (
            {"json": event_json(1), "headers": {"Authorization": f"Basic {ADMIN_TOKEN}"}},
            401,
            "bearer token",
        ),
        ({"json": event_json(1, node="n2"), "headers": N1}, 403, "may not report events for n2"),
        (
            {"json": {"events": [event_json(1), event_json(2, node="n3")]}, "headers": N1},
            403,
            "for n3",
        ),
        ({"content": b"{" + b" " * 20_000 + b"}", "headers": ADMIN}, 413, "over 20000 bytes"),
        ({"content": _chunks(30_000), "headers": ADMIN}, 413, "over 20000 bytes"),
        ({"json": _bad_fault(), "headers": ADMIN}, 422, ["body", "fault"]),
        ({"json": {**event_json(1), "colour": "red"}, "headers": ADMIN}, 422, ["body", "colour"]),
        (
            {"json": {"events": [event_json(1), {**event_json(2), "node": None}]}, "headers": N1},
            422,
            ["body", "events", 1, "node"],
        ),
        ({"content": b"not json", "headers": ADMIN}, 422, ["body"]),
    ],
    ids=[
        "no-token",
        "unknown-token",
        "not-bearer",
        "other-node",
        "other-node-in-batch",
        "too-large",
        "too-large-chunked",
        "bad-fault",
        "unknown-field",
        "bad-field-in-batch",
        "not-json",
    ],
)
def test_rejections_record_nothing(
    api: Api, kwargs: dict[str, Any], status: int, detail: str | list[Any]
) -> None:
    r = api.client.post("/v1/events", **kwargs)
    assert r.status_code == status, r.text
    got = r.json()["detail"]
    if isinstance(detail, str):
        assert detail in got
    else:
        assert detail in [e["loc"] for e in got], got
    assert api.stored_ids() == []
    assert api.coordinator.submitted_ids() == []
    metrics = api.client.get("/metrics").text
    assert f'recover_intake_rejected_requests_total{{status="{status}"}} 1.0' in metrics
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_one_event_is_durable_before_the_reply(api: Api) -> None:
    r = api.client.post("/v1/events", json=event_json(1), headers=N1)
    assert r.status_code == 200
    assert r.json() == {"accepted": ["ev-1"], "duplicates": []}
    assert api.stored_ids() == ["ev-1"]
    assert api.coordinator.submitted_ids() == ["ev-1"]


def test_admin_reports_for_any_node(api: Api) -> None:
    body = {"events": [event_json(1, node="n2"), event_json(2, node="n9")]}
    r = api.client.post("/v1/events", json=body, headers=ADMIN)
    assert r.json() == {"accepted": ["ev-1", "ev-2"], "duplicates": []}


def test_duplicates_are_acknowledged_and_stored_once(api: Api) -> None:
    api.client.post("/v1/events", json=event_json(1), headers=N1)
    body = {"events": [event_json(2), event_json(1), event_json(2), event_json(3)]}
    r = api.client.post("/v1/events", json=body, headers=N1)
    assert r.status_code == 200
    assert r.json() == {"accepted": ["ev-2", "ev-3"], "duplicates": ["ev-1", "ev-2"]}
    again = api.client.post("/v1/events", json=event_json(1), headers=N1)
    assert again.json() == {"accepted": [], "duplicates": ["ev-1"]}
    assert api.stored_ids() == ["ev-1", "ev-2", "ev-3"]
    assert api.coordinator.submitted_ids() == ["ev-1", "ev-2", "ev-3"]
    metrics = api.client.get("/metrics").text
    assert 'recover_intake_events_total{outcome="accepted"} 3.0' in metrics
    assert 'recover_intake_events_total{outcome="duplicate"} 3.0' in metrics


def test_a_batch_is_stored_in_order(api: Api) -> None:
    body = {"events": [event_json(i, node="n1") for i in range(100)]}
    r = api.client.post("/v1/events", content=json.dumps(body), headers=N1)
    assert len(r.json()["accepted"]) == 100
    assert api.stored_ids() == [f"ev-{i}" for i in range(100)]


def test_concurrent_requests_all_land_once(api: Api) -> None:
    def post(i: int) -> httpx.Response:
        with httpx.Client(base_url=api.url) as c:  # one connection per request
            return c.post("/v1/events", json=event_json(i % 40), headers=ADMIN)

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(post, range(80)))
    assert {r.status_code for r in replies} == {200}
    accepted = [i for r in replies for i in r.json()["accepted"]]
    assert sorted(accepted) == sorted(f"ev-{i}" for i in range(40)), "each id accepted once"
    assert sorted(api.stored_ids()) == sorted(accepted)
    metrics = api.client.get("/metrics").text
    assert "recover_intake_commit_events_count" in metrics


def test_the_router_path_answers_the_same(api: Api) -> None:
    fast = api.app.intake
    api.app.intake = None  # every event request now goes through FastAPI's router
    try:
        ok = api.client.post("/v1/events", json=event_json(1), headers=N1)
        dup = api.client.post("/v1/events", json={"events": [event_json(1)]}, headers=N1)
        anon = api.client.post("/v1/events", json=event_json(2))
        bad = api.client.post("/v1/events", json=_bad_fault(), headers=N1)
    finally:
        api.app.intake = fast
    assert (ok.status_code, ok.json()) == (200, {"accepted": ["ev-1"], "duplicates": []})
    assert dup.json() == {"accepted": [], "duplicates": ["ev-1"]}
    assert (anon.status_code, anon.headers["www-authenticate"]) == (401, "Bearer")
    assert bad.status_code == 422
    assert ["body", "fault"] in [e["loc"] for e in bad.json()["detail"]]
    assert api.stored_ids() == ["ev-1"]
