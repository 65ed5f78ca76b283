"""Single actions (promotions, requeues) after a storm's batched take-down: they run in the
same step however long the take-down took, and give way at once when an event arrives, which
is then decided first. The fake Slurm here pays a round trip per call on the rig's clock, as
a busy slurmctld does (a 150-node take-down took 1-2 s on a real one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from recovery.policy import BreakerConfig, PolicyConfig
from recovery.ports.clock import FakeClock
from tests.fakes.slurm import FakeSlurm

from .helpers import Rig, event

NODES = [f"n{i}" for i in range(1, 7)]
SPARES = ["s1", "s2", "s3"]
RAISED = PolicyConfig(breaker=BreakerConfig(max_nodes=100, max_fraction=1.0))
REASON = "recover: xid79 GPU has fallen off the bus"


class SlowSlurm(FakeSlurm):
    """Every call takes ``latency_s`` on ``clock``; ``after_resume`` runs after each resume."""

    def __init__(self, clock: FakeClock, latency_s: float) -> None:
        def pass_time(seconds: float) -> None:
            clock.advance(seconds)

        super().__init__(NODES, SPARES, latency_s=latency_s, sleep=pass_time)
        self.after_resume: Callable[[str], None] = lambda _node: None

    def resume(self, node: str, *, force: bool = False) -> bool:
        changed = super().resume(node, force=force)
        self.after_resume(node)
        return changed


def _rig(tmp_path: Path, latency_s: float) -> tuple[Rig, SlowSlurm]:
    clock = FakeClock()
    slurm = SlowSlurm(clock, latency_s)
    return Rig(tmp_path / "j.sqlite", slurm, config=RAISED, clock=clock), slurm


def test_every_spare_is_promoted_in_the_step_of_a_long_take_down(tmp_path: Path) -> None:
    # Each call costs 0.4 s: the step's reads and the take-down alone take longer than a
    # slice timed from the step's start would have left for the promotions.
    rig, slurm = _rig(tmp_path, latency_s=0.4)
    rig.send(*(event(n) for n in ("n1", "n2", "n3")))
    assert slurm.updates() == [
        ("down", "n1,n2,n3", REASON),
        ("resume", "s1"),
        ("resume", "s2"),
        ("resume", "s3"),
    ]
    assert all("spare-promoted" in rig.phases(n) for n in ("n1", "n2", "n3"))


def test_promotions_give_way_to_an_event_that_arrives_and_it_is_decided_first(
    tmp_path: Path,
) -> None:
    rig, slurm = _rig(tmp_path, latency_s=0.0)
    late = event("n4")

    def arrives(node: str) -> None:
        if node == "s1":  # the intake commits an event while the first promotion runs
            rig.journal.append_events([late], rig.clock.now())
            rig.engine.submit([late])

    slurm.after_resume = arrives
    rig.send(event("n1"), event("n2"))
    # The first promotion ran; the second gave way to the event.
    assert slurm.updates() == [("down", "n1,n2", REASON), ("resume", "s1")]
    assert [s.event.id for s in rig.journal.undecided()] == [late.id]
    rig.engine.step()
    assert slurm.updates()[2:] == [("down", "n4", REASON), ("resume", "s2"), ("resume", "s3")]
    assert all("spare-promoted" in rig.phases(n) for n in ("n1", "n2", "n4"))


def test_without_news_single_actions_stop_after_the_slice(tmp_path: Path) -> None:
    # 0.8 s a call: the first promotion (a read of the pool and a resume) takes 1.6 s, the
    # second (the pool is read once a round) ends past the 2 s slice; the next step goes on.
    rig, slurm = _rig(tmp_path, latency_s=0.8)
    rig.send(*(event(n) for n in ("n1", "n2", "n3")))
    assert [u[0] for u in slurm.updates()] == ["down", "resume", "resume"]
    rig.engine.step()
    assert [u[0] for u in slurm.updates()] == ["down", "resume", "resume", "resume"]
