"""The election's rules (recovery/coordinator/leader.py) on the in-memory lease: one leader,
takeover only after the record sat unchanged for the lease's duration by the taker's own
clock, a leader that cannot renew stops acting before anyone may take over, terms that grow,
and, under random schedules of ticks, store failures and lost answers, never two replicas
that may act at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.coordinator.leader import Deposed, Elector
from recovery.errors import UsageError
from tests.fakes.lease import MemoryLease
from tests.lease_contract import check_lease_store


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


#: The timings these tests count in (not the defaults, which may change): a lease of 6 s,
#: a leader that stops acting 4 s after its last renewal, a round every second.
TIMES = {"duration_s": 6.0, "renew_deadline_s": 4.0, "retry_s": 1.0}


def _pair(store: MemoryLease, clock: Clock) -> tuple[Elector, Elector]:
    return (
        Elector(store, "r1", clock, lambda: 1_800_000_000.0 + clock.t, **TIMES),
        Elector(store, "r2", clock, lambda: 1_800_000_000.0 + clock.t, **TIMES),
    )


def test_the_memory_lease_keeps_the_contract() -> None:
    store = MemoryLease()
    check_lease_store(store, store)


def test_the_first_replica_leads_and_the_other_waits_while_it_renews() -> None:
    store, clock = MemoryLease(), Clock()
    r1, r2 = _pair(store, clock)
    first = r1.tick()
    assert (first.leading, first.changed, first.term) == (True, True, 1)
    assert "created the lease" in first.detail
    for _ in range(30):  # 30 s of renewals every second: r2 never takes over
        clock.t += 1.0
        assert r1.tick().leading
        standing = r2.tick()
        assert not standing.leading
        assert standing.holder == "r1"
        assert r1.may_act()
        assert not r2.may_act()
    with pytest.raises(Deposed, match="held by r1"):
        r2.fence("drain node1")
    r1.fence("drain node1")


def test_a_dead_leader_is_replaced_after_the_duration_at_the_next_term() -> None:
    store, clock = MemoryLease(), Clock()
    r1, r2 = _pair(store, clock)
    r1.tick()
    r2.tick()  # sees r1's record: the duration counts from here, by r2's clock
    for _ in range(5):
        clock.t += 1.0
        assert not r2.tick().leading
    clock.t += 1.0  # 6 s since r2 first saw this version unchanged
    took = r2.tick()
    assert (took.leading, took.changed, took.term) == (True, True, 2)
    assert "r1 did not renew for 6 s" in took.detail
    assert r2.may_act()
    # r1 comes back: its renewal conflicts, it reads r2's record and stands down at once.
    back = r1.tick()
    assert (back.leading, back.changed, back.holder) == (False, True, "r2")
    assert not r1.may_act()


def test_a_leader_that_cannot_renew_stops_acting_before_anyone_may_take_over() -> None:
    store, clock = MemoryLease(), Clock()
    r1, r2 = _pair(store, clock)
    r1.tick()
    r2.tick()
    store.down = True
    for _ in range(3):
        clock.t += 1.0
        assert r1.tick().leading  # renewals fail, but the deadline (4 s) is not past
        assert r1.may_act()
    clock.t += 1.0
    down = r1.tick()
    assert (down.leading, down.changed) == (False, True)
    assert "not renewed for 4 s: stepped down" in down.detail
    assert not r1.may_act()
    store.down = False
    clock.t += 1.0
    assert not r2.tick().leading  # 5 s: r2 may not take it yet, r1 no longer acts
    clock.t += 1.0
    assert r2.tick().leading


def test_a_clean_shutdown_hands_over_at_once() -> None:
    store, clock = MemoryLease(), Clock()
    r1, r2 = _pair(store, clock)
    r1.tick()
    r2.tick()
    r1.release()
    assert not r1.may_act()
    clock.t += 1.0
    took = r2.tick()
    assert took.leading
    assert took.term == 2
    assert "given up" in took.detail


def test_a_renewal_whose_answer_was_lost_counts_from_before_it_was_sent() -> None:
    store, clock = MemoryLease(), Clock()
    r1, _ = _pair(store, clock)
    r1.tick()
    store.lose_answers = True
    clock.t += 1.0
    r1.tick()  # landed, but r1 does not know: its renewal still dates from t=100
    assert store.record is not None
    store.lose_answers = False
    clock.t += 1.0
    # The version r1 holds is stale now: a conflict, a read, still ours, renewed next time.
    assert r1.tick().leading
    clock.t += 1.0
    assert r1.tick().detail == "renewed"


def test_bad_settings_name_what_is_valid() -> None:
    with pytest.raises(UsageError, match="renew_deadline_s \\+ retry_s <= duration_s"):
        Elector(MemoryLease(), "r1", Clock(), Clock(), duration_s=4, renew_deadline_s=4)
    with pytest.raises(UsageError, match="non-empty identity"):
        Elector(MemoryLease(), "", Clock(), Clock())


# One step of a schedule: which replica ticks (or none), how far the clock moves, and what
# the store does meanwhile.
_step = st.tuples(
    st.sampled_from([0, 1, 2, None]),
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]), st.floats(0.0, 2.5)),
    st.sampled_from(["ok", "ok", "ok", "down", "lose"]),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_step, min_size=1, max_size=120), st.booleans())
def test_never_two_replicas_may_act_at_once(
    schedule: list[tuple[int | None, float, str]], defaults: bool
) -> None:
    store, clock = MemoryLease(), Clock()
    wall = lambda: 1_800_000_000.0 + clock.t  # noqa: E731
    times = {} if defaults else TIMES  # the shipped timings, or the slower ones above
    replicas = [Elector(store, f"r{i}", clock, wall, **times) for i in range(3)]
    terms: list[int] = []
    for who, advance, mode in schedule:
        store.down, store.lose_answers = mode == "down", mode == "lose"
        clock.t += advance
        if who is not None:
            replicas[who].tick()
        acting = [r.identity for r in replicas if r.may_act()]
        assert len(acting) <= 1, (acting, clock.t)
        if acting:
            terms.append(next(r.term for r in replicas if r.may_act()))
    assert terms == sorted(terms)  # a leader's term never goes back
