"""``recover policy replay``: re-decide a journal's history under another policy, acting on
nothing, and list what would have differed.

The engine's own rules are used (operator repairs included, breaker resets applied at their
recorded times), against the cluster layout the coordinator last recorded, so a replay under
the same policy reports no difference.
"""

from __future__ import annotations

import json

from recovery.coordinator.engine import RESETS_KEY
from recovery.coordinator.rules import Rules
from recovery.coordinator.views import LAYOUT_KEY, layout_nodes
from recovery.errors import UsageError
from recovery.policy import Catalogue, PolicyConfig, ReplayDifference, differences
from recovery.ports.journal import Journal


def replay_history(
    journal: Journal, config: PolicyConfig, catalogue: Catalogue
) -> list[ReplayDifference]:
    """Every event of ``journal`` whose decision under ``config`` would differ from the
    recorded one. Raises UsageError when the journal holds no cluster layout (no coordinator
    ever ran a tick with it)."""
    layout = journal.get_meta(LAYOUT_KEY)
    if layout is None:
        raise UsageError("the journal records no cluster layout: was a coordinator ever run on it?")
    nodes = layout_nodes(layout)
    resets = [float(t) for t in json.loads(journal.get_meta(RESETS_KEY) or "[]")]
    rules = Rules(config, catalogue)
    out = []
    for stored, recorded in journal.history():
        at = stored.received.wall
        while resets and resets[0] <= at:
            rules.breaker_reset(resets.pop(0))
        ev = stored.event
        try:
            replayed = rules.decide(ev, nodes, at)
        except UsageError as e:  # a repair the other policy refuses: say so, keep going
            replayed = None
            note = str(e)
        if replayed is None:
            if recorded is not None and recorded.actions:
                out.append(
                    ReplayDifference(
                        ev.id, ev.node, ev.fault, at, (f"refused: {note}",), recorded, recorded
                    )
                )
            continue
        rules.record(ev, replayed, at)
        fields = differences(recorded, replayed)
        if fields:
            out.append(ReplayDifference(ev.id, ev.node, ev.fault, at, fields, recorded, replayed))
    return out
