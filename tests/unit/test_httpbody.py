"""recovery.httpbody: the reason an HTTP error answer gives, read from literal bodies (the one
reading the operator verbs' client and the node agent's link share)."""

from __future__ import annotations

import pytest

from recovery.httpbody import LIMIT, error_reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # the API's own refusals and FastAPI's HTTPException: {"detail": "..."}
        ('{"detail": "Unknown node \'node9\'. Known: node1, node2"}',
         "Unknown node 'node9'. Known: node1, node2"),
        ('{"detail": "  padded  "}', "padded"),
        # FastAPI's validation errors: a list under "detail", shown as it is
        ('{"detail": [{"loc": ["body", "fault"], "msg": "field required"}]}',
         "[{'loc': ['body', 'fault'], 'msg': 'field required'}]"),
        # JSON without "detail": the document itself
        ('{"error": "busy"}', "{'error': 'busy'}"),
        ('["a", "b"]', "['a', 'b']"),
        ('"just a string"', "just a string"),
        # not JSON: the text as it came (a proxy's page, a plain-text 502)
        ("Bad Gateway\n", "Bad Gateway"),
        ("<html><body>502</body></html>", "<html><body>502</body></html>"),
        # nothing to show
        ("", "(empty body)"),
        ("  \n", "(empty body)"),
        ('{"detail": ""}', "(empty body)"),
    ],
)  # fmt: skip
def test_the_reason_of_a_body(body: str, reason: str) -> None:
    assert error_reason(body) == reason


@pytest.mark.parametrize(
    "body",
    ["x" * 5000, '{"detail": "' + "y" * 5000 + '"}', '{"detail": [' + "1, " * 3000 + "1]}"],
    ids=["text", "detail", "structured detail"],
)
def test_a_long_body_is_cut_and_says_so(body: str) -> None:
    got = error_reason(body)
    assert len(got) == LIMIT + 3
    assert got.endswith("...")
    assert len(error_reason(body, limit=20)) == 23


def test_a_body_at_the_limit_is_whole() -> None:
    assert error_reason("z" * LIMIT) == "z" * LIMIT
