"""``recover inject --wait``: the decision, then its incident's actions applied, so that
``recover status`` right after shows what the coordinator did (the runbook relies on it)."""

from __future__ import annotations

from typing import Any

import pytest

from recovery.errors import RecoverError, UsageError
from service.httpapi.client import wait_decision

DECISION = {"event_id": "e1", "verdict": "replace", "incident": "inc-1"}


class _Coordinator:
    """Answers the two GETs from scripted states; records the paths asked."""

    def __init__(self, statuses: list[list[str]], incident_known: bool = True) -> None:
        self.statuses = statuses
        self.known = incident_known
        self.asked: list[str] = []

    def get(self, path: str) -> Any:
        self.asked.append(path)
        if path.startswith("/v1/events/"):
            return {"event_id": "e1", "stored": True, "decision": DECISION}
        if not self.known:
            raise UsageError("Unknown incident 'inc-1'")
        now = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        kinds = ("down", "promote")
        actions = [{"kind": k, "status": s} for k, s in zip(kinds, now, strict=False)]
        return {"id": "inc-1", "actions": actions}


def _wait(c: _Coordinator, timeout_s: float = 30.0) -> dict[str, Any]:
    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    return wait_decision(c, "e1", timeout_s, 0.2, sleep, lambda: clock[0])  # type: ignore[arg-type]


def test_it_returns_once_no_action_is_still_planned() -> None:
    c = _Coordinator([["planned", "planned"], ["done", "planned"], ["done", "done"]])
    assert _wait(c) == DECISION
    assert c.asked.count("/v1/incidents/inc-1") == 3


@pytest.mark.parametrize("settled", ["held", "waiting", "failed", "expired"])
def test_an_action_that_cannot_go_on_ends_the_wait_too(settled: str) -> None:
    assert _wait(_Coordinator([["done", settled]])) == DECISION


def test_an_incident_the_coordinator_does_not_show_ends_the_wait() -> None:
    c = _Coordinator([["planned"]], incident_known=False)
    assert _wait(c) == DECISION


def test_actions_never_applied_name_themselves_after_the_timeout() -> None:
    with pytest.raises(RecoverError, match=r"inc-1 was decided, but its actions \(down\)"):
        _wait(_Coordinator([["planned"]]), timeout_s=2)


class _Lagging(_Coordinator):
    """Actions applied at wall 100; the coordinator's view read at these times, in turn."""

    def __init__(self, seen: list[float]) -> None:
        super().__init__([["done", "done"]])
        self.seen = seen

    def get(self, path: str) -> Any:
        if path == "/v1/status":
            self.asked.append(path)
            return {"seen_at": self.seen.pop(0) if len(self.seen) > 1 else self.seen[0]}
        doc = super().get(path)
        for a in doc.get("actions", []):
            a["finished"] = {"wall": 100.0, "mono": 5.0}
        return doc


def test_it_returns_once_the_coordinators_view_is_newer_than_the_actions() -> None:
    """`recover status` shows the coordinator's last read of Slurm: wait until that read
    started after the take-out, so the DOWN is in it (the runbook checks right after)."""
    c = _Lagging([99.0, 99.9, 100.4])
    assert _wait(c) == DECISION
    assert c.asked.count("/v1/status") == 3


def test_a_view_that_never_catches_up_ends_the_wait_quietly_at_the_timeout() -> None:
    c = _Lagging([99.0])
    assert _wait(c, timeout_s=2) == DECISION  # the actions are done; only the view lags
