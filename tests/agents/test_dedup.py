"""Deduplication windows on a fake clock."""

from __future__ import annotations

import pytest

from agents.dedup import Deduplicator
from agents.kmsg import parse_line, to_event
from recovery.model import HealthEvent, Source
from recovery.ports.clock import FakeClock


def _event(
    n: int, *, fault: str = "xid95", accelerator: int | None = 0, node: str = "n1"
) -> HealthEvent:
    return HealthEvent(
        id=f"{node}:kmsg:{n:06d}",
        node=node,
        source=Source.kmsg,
        fault=fault,
        accelerator=accelerator,
        observed_at=1.8e9 + n,
        message=f"line {n}",
    )


def test_first_passes_at_once_repeats_fold_into_one_summary(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=30)
    assert d.offer(_event(0)) == [_event(0)]
    clock.advance(1)
    assert d.offer(_event(1)) == []
    clock.advance(1)
    assert d.offer(_event(2)) == []
    clock.advance(27.9)
    assert d.flush() == []
    clock.advance(0.1)
    (summary,) = d.flush()
    assert summary.count == 2
    assert summary.id == "n1:kmsg:000000.r"
    assert summary.observed_at == _event(2).observed_at
    assert "2 repeats within 30 s" in summary.message
    assert d.pending() == 0


def test_a_window_without_repeats_closes_silently(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=10)
    d.offer(_event(0))
    clock.advance(11)
    assert d.flush() == []
    assert d.offer(_event(1)) == [_event(1)]  # a new window: passes at once


@pytest.mark.parametrize(
    "other",
    [
        _event(1, fault="xid79"),
        _event(1, accelerator=1),
        _event(1, accelerator=None),
        _event(1, node="n2"),
    ],
)
def test_different_node_fault_or_accelerator_is_not_a_repeat(
    clock: FakeClock, other: HealthEvent
) -> None:
    d = Deduplicator(clock, window_s=30)
    d.offer(_event(0))
    assert d.offer(other) == [other]


def test_a_flood_of_identical_xid95_lines_becomes_a_handful_of_events(clock: FakeClock) -> None:
    """10,000 XID 95 lines over 100 s (one per 10 ms) with a 30 s window."""
    d = Deduplicator(clock, window_s=30)
    line = "[{:.6f}] NVRM: Xid (PCI:0000:86:00): 95, pid=7, name=python, Uncontained: FBHUB."
    out: list[HealthEvent] = []
    for i in range(10_000):
        fault = parse_line(line.format(100 + i / 100))
        assert fault is not None
        out += d.offer(to_event(fault, node="n1", boot_id="b", observed_at=1.8e9 + i / 100))
        clock.advance(0.01)
    out += d.drain()
    assert 2 <= len(out) <= 8, [(e.id, e.count) for e in out]
    assert sum(e.count for e in out) == 10_000, "every line is accounted for"
    assert len({e.id for e in out}) == len(out)


def test_ids_are_deterministic(clock: FakeClock) -> None:
    def run() -> list[str]:
        c = FakeClock()
        d = Deduplicator(c, window_s=5)
        ids = []
        for i in range(50):
            ids += [e.id for e in d.offer(_event(i))]
            c.advance(0.5)
        return ids + [e.id for e in d.drain()]

    assert run() == run()
    assert len(set(run())) == len(run())


def test_summaries_leave_oldest_window_first(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=10)
    d.offer(_event(0, fault="xid79"))
    clock.advance(1)
    d.offer(_event(1, fault="xid95"))
    d.offer(_event(2, fault="xid95"))
    d.offer(_event(3, fault="xid79"))
    clock.advance(20)
    assert [e.fault for e in d.flush()] == ["xid79", "xid95"]


def test_offer_also_delivers_summaries_that_are_due(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=10)
    d.offer(_event(0))
    d.offer(_event(1))
    clock.advance(10)
    out = d.offer(_event(2))
    assert [(e.id, e.count) for e in out] == [("n1:kmsg:000000.r", 1), (_event(2).id, 1)]


def test_folded_events_add_their_own_counts(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=10)
    d.offer(_event(0))
    d.offer(_event(1).model_copy(update={"count": 40}))
    (summary,) = d.drain()
    assert summary.count == 40


@pytest.mark.parametrize("window", [0, -1.0])
def test_window_must_be_positive(clock: FakeClock, window: float) -> None:
    with pytest.raises(ValueError, match="window_s must be > 0"):
        Deduplicator(clock, window_s=window)


def _from_line(line: str, n: int) -> HealthEvent:
    fault = parse_line(line)
    assert fault is not None
    return to_event(fault, node="n1", boot_id="b", observed_at=1.8e9 + n)


def test_an_xid79_and_its_fallen_off_the_bus_line_are_one_fault(clock: FakeClock) -> None:
    """The same GPU, the same burst, any spelling of its bus id, no bus map: one event now,
    the other folded into it."""
    d = Deduplicator(clock, window_s=30)
    xid = _from_line("[1.000001] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 0)
    fell = _from_line("[1.000101] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", 1)
    assert (xid.accelerator, fell.accelerator) == (None, None)
    assert d.offer(xid) == [xid]
    assert d.offer(fell) == []
    (summary,) = d.drain()
    assert summary.count == 1


def test_two_gpus_without_a_bus_map_are_never_folded_together(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=30)
    a = _from_line("[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 0)
    b = _from_line("[1.1] NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus.", 1)
    assert d.offer(a) == [a]
    assert d.offer(b) == [b]


def test_a_new_recovery_action_or_a_fatal_sxid_is_news(clock: FakeClock) -> None:
    d = Deduplicator(clock, window_s=30)
    text = "NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from {} to {}"
    first = _from_line(text.format("0x0 (None)", "0x1 (GPU Reset Required)"), 0)
    worse = _from_line(text.format("0x1 (GPU Reset Required)", "0x2 (Node Reboot Required)"), 1)
    assert d.offer(first) == [first]
    assert d.offer(worse) == [worse]
    sxid = "nvidia-nvswitch0: SXid (PCI:0000:c5:00.0): 24007, {}, Link 4 sourcetrack timeout"
    calm = _from_line(sxid.format("Non-fatal"), 2)
    fatal = _from_line(sxid.format("Fatal"), 3)
    assert d.offer(calm) == [calm]
    assert d.offer(fatal) == [fatal]
