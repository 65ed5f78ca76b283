"""Request bodies to events, on literal payloads: which shape, and which field is wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from recovery.model import HealthEvent
from service.httpapi.intake import field_errors, parse_events, reply_body
from tests.service.helpers import event

ONE = b'{"id": "e1", "node": "n1", "source": "nvml", "fault": "xid79", "observed_at": 5}'
TWO = (
    b'{"events": [{"id": "e1", "node": "n1", "source": "kmsg", "fault": "xid79", '
    b'"observed_at": 5}, {"id": "e2", "node": "n2", "source": "tpu", "fault": "tpu-hbm", '
    b'"observed_at": 6.5, "count": 3}]}'
)
# A single event whose message says "events": the cheap shape test guesses wrong, the
# fallback still reads it as one event.
SAYS_EVENTS = (
    b'{"id": "e1", "node": "n1", "source": "nvml", "fault": "xid79", "observed_at": 5, '
    b'"message": "events"}'
)


@pytest.mark.parametrize(
    ("body", "ids"),
    [(ONE, ["e1"]), (TWO, ["e1", "e2"]), (SAYS_EVENTS, ["e1"]), (b"  \n" + ONE, ["e1"])],
)
def test_valid_bodies(body: bytes, ids: list[str]) -> None:
    events = parse_events(body)
    assert [e.id for e in events] == ids
    assert all(isinstance(e, HealthEvent) for e in events)


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        (ONE.replace(b'"xid79"', b'"XID 79"'), ["body", "fault"], "string_pattern_mismatch"),
        (ONE.replace(b"}", b', "colour": "red"}'), ["body", "colour"], "extra_forbidden"),
        (ONE.replace(b'"node": "n1", ', b""), ["body", "node"], "missing"),
        (ONE.replace(b'"nvml"', b'"smoke"'), ["body", "source"], "enum"),
        (
            TWO.replace(b'"tpu-hbm"', b'"TPU HBM"'),
            ["body", "events", 1, "fault"],
            "string_pattern_mismatch",
        ),
        (
            TWO.replace(b'"count": 3', b'"count": 0'),
            ["body", "events", 1, "count"],
            "greater_than_equal",
        ),
        (b'{"events": []}', ["body", "events"], "too_short"),
        (b'{"events": [], "more": 1}', ["body", "more"], "extra_forbidden"),
        (b"{not json", ["body"], "json_invalid"),
        (b"", ["body"], "json_invalid"),
        (b"[1, 2]", ["body"], "model_type"),
    ],
)
def test_invalid_bodies_name_the_field(body: bytes, loc: list[str | int], kind: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_events(body)
    errors = field_errors(info.value)
    assert {"loc": loc, "type": kind} in [{"loc": e["loc"], "type": e["type"]} for e in errors]


def test_reply_body_is_json() -> None:
    import json

    events = [event(1), event(2), event(3)]
    assert json.loads(reply_body(events, [True, False, True])) == {
        "accepted": ["ev-1", "ev-3"],
        "duplicates": ["ev-2"],
    }
    assert json.loads(reply_body(events[:1], [False])) == {"accepted": [], "duplicates": ["ev-1"]}
