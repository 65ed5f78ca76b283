"""Properties over arbitrary valid events: decide never raises, folding is deterministic, and
the breaker's limits hold at every step."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.model import Decision, Drain, DriverAction, HealthEvent, Source, TakeDown, Verdict
from recovery.model.events import EVENT_ID_PATTERN, FAULT_PATTERN, NODE_PATTERN
from recovery.policy import (
    BreakerConfig,
    Catalogue,
    ClusterView,
    FlappingConfig,
    PolicyConfig,
    PolicyState,
    advance,
    breaker_status,
    decide,
    load_catalogue,
    rebuild,
    replay,
)
from recovery.policy.breaker import partition_limit

from .helpers import T0, cluster

CATALOGUE: Catalogue = load_catalogue()
VIEW: ClusterView = cluster(n=6, spares=2)

faults = st.one_of(
    st.sampled_from([*CATALOGUE.known(), "xid14", "xid0"]),
    st.from_regex(FAULT_PATTERN, fullmatch=True),
)
nodes = st.one_of(
    st.sampled_from(VIEW.names),
    st.from_regex(NODE_PATTERN, fullmatch=True),
)
events = st.builds(
    HealthEvent,
    id=st.from_regex(EVENT_ID_PATTERN, fullmatch=True),
    node=nodes,
    source=st.sampled_from(Source),
    fault=faults,
    accelerator=st.none() | st.integers(0, 1023),
    observed_at=st.floats(0, 4e9),
    count=st.integers(1, 10**9),
    message=st.text(max_size=40),
    injected=st.booleans(),
    driver_action=st.none() | st.sampled_from(DriverAction),
)
configs = st.builds(
    PolicyConfig,
    verdicts=st.dictionaries(st.sampled_from(CATALOGUE.known()), st.sampled_from(Verdict)).map(
        MappingProxyType
    ),
    correlation_window_s=st.sampled_from([0.0, 30.0]),
    flood_window_s=st.sampled_from([0.0, 5.0, 300.0]),
    escalation_window_s=st.sampled_from([0.0, 3600.0]),
    flapping=st.builds(FlappingConfig, threshold=st.integers(1, 4)),
    breaker=st.builds(
        BreakerConfig,
        window_s=st.sampled_from([10.0, 300.0]),
        max_fraction=st.sampled_from([0.0, 0.5, 1.0]),
        max_nodes=st.integers(1, 4),
    ),
    dry_run=st.booleans(),
)
# Unique event ids, as the journal guarantees; receipt times never go backwards.
histories = st.lists(st.tuples(events, st.floats(0, 120)), max_size=30, unique_by=lambda p: p[0].id)


def _fold(
    history: list[tuple[HealthEvent, float]], config: PolicyConfig
) -> tuple[PolicyState, list[Decision]]:
    state, now = PolicyState.empty(), T0
    out: list[Decision] = []
    for ev, gap in history:
        now += gap
        d = decide(state, ev, VIEW, config, CATALOGUE, now)
        state = advance(state, ev, d, now)
        out.append(d)
        _check_breaker(state, config, now)
    return state, out


def _check_breaker(state: PolicyState, config: PolicyConfig, now: float) -> None:
    status = breaker_status(state, VIEW, config, now)
    assert len(status.taken_out) <= config.breaker.max_nodes
    for load in status.partitions:
        assert load.taken_out <= partition_limit(load.size, config)


@settings(deadline=None, max_examples=150)
@given(ev=events, config=configs, now=st.floats(0, 4e9))
def test_decide_never_raises_and_acts_on_the_event_node(
    ev: HealthEvent, config: PolicyConfig, now: float
) -> None:
    d = decide(PolicyState.empty(), ev, VIEW, config, CATALOGUE, now)
    assert d.event_id == ev.id
    assert d.node == ev.node
    assert all(a.node == ev.node for a in d.actions)
    assert not d.held or d.verdict.rank >= Verdict.drain_reset.rank
    for a in d.actions:
        if isinstance(a, TakeDown | Drain):
            assert '"' not in a.reason
            assert "\n" not in a.reason
    if not VIEW.has(ev.node) or ev.source is Source.heartbeat:
        assert d.actions == ()


@settings(deadline=None, max_examples=100)
@given(history=histories, config=configs)
def test_folding_is_deterministic_and_replays_clean(
    history: list[tuple[HealthEvent, float]], config: PolicyConfig
) -> None:
    state1, decisions1 = _fold(history, config)
    state2, decisions2 = _fold(history, config)
    assert state1 == state2
    assert decisions1 == decisions2
    recorded = []
    now = T0
    for (ev, gap), d in zip(history, decisions1, strict=True):
        now += gap
        recorded.append((ev, now, d))
    assert replay(recorded, VIEW, config, CATALOGUE) == []
    assert rebuild(recorded) == state1
