"""recovery.errors.unknown_choice: plain names alphabetically, numbered ones by number, a long
numbered family summarised so the common names fit in a cut HTTP error."""

from __future__ import annotations

from recovery.errors import unknown_choice
from recovery.httpbody import LIMIT
from recovery.policy.catalogue import load_catalogue


def test_numbered_names_sort_by_number_after_plain_ones() -> None:
    err = unknown_choice("node", "n", ["node10", "spare1", "node2", "login", "node1"])
    assert str(err) == "Unknown node 'n'. Known: login, node1, node2, node10, spare1"
    assert err.exit_code == 2


def test_the_catalogue_fits_what_http_clients_show_with_every_xid_named() -> None:
    known = load_catalogue().known()
    text = str(unknown_choice("fault", "xid9999x", known))
    assert len(text) <= LIMIT
    listed = text.split("Known: ", 1)[1].split(", ")
    assert {k for k in known if not k.startswith("sxid")} == {
        k for k in listed if not k.startswith("sxid") and "<N>" not in k
    }
    sxids = [k for k in known if k.startswith("sxid")]
    assert f"{len(sxids)} sxid<N> ({sxids[0]} ... {sxids[-1]})" in text


def test_nothing_known_says_so() -> None:
    assert str(unknown_choice("fault", "x", [])) == "Unknown fault 'x'. Known: (none)"
