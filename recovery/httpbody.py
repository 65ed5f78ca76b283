"""What an HTTP error answer says, for an error message: one reading of the body for every
client of the coordinator's API (the ``recover`` operator verbs and the node agent's link).

Pure: the body's text in, one line of reason out; no HTTP client here.
"""

from __future__ import annotations

import json

#: The most characters of an answer an error message carries (an HTML error page from a proxy,
#: a long list of validation errors).
LIMIT = 640


def error_reason(body: str, *, limit: int = LIMIT) -> str:
    """The reason an error answer's ``body`` gives: the ``detail`` of a JSON object (what the
    API's handlers and FastAPI's validation send), else the JSON document itself, else the
    text as it came; stripped, cut to ``limit`` characters (``...`` marks a cut), and
    ``(empty body)`` when there is nothing."""
    try:
        doc = json.loads(body)
    except ValueError:
        text = body
    else:
        detail = doc.get("detail", doc) if isinstance(doc, dict) else doc
        text = detail if isinstance(detail, str) else str(detail)
    text = text.strip()
    if not text:
        return "(empty body)"
    return text if len(text) <= limit else text[:limit] + "..."
