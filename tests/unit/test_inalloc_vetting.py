"""The job supervisor checks its spares before a relaunch puts work on them
(recovery/inalloc/vetting.py), with the fake JobSlurm of test_inalloc_supervisor and a fake
check: a spare that fails is held out (drained with the failed check as its reason, given
back) and the next one taken; a check runs at the relaunch only for as many spares as it
needs; a stale passing check is made again; one Slurm will not let the job drain is kept
unused."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.inalloc.decide import Finish, Requeue
from recovery.inalloc.vetting import Vetting
from recovery.pool.validate import CheckResult, NodeCheck
from tests.unit.test_inalloc_supervisor import FakeJob, _run


@dataclass
class FakeCheck:
    """Fails the nodes in ``bad`` (their burn-in), passes the others; ``raises``: nodes whose
    check itself breaks."""

    bad: set[str] = field(default_factory=set)
    raises: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)
    """Nodes whose agent is dead (the cheap check fails)."""
    checked: list[str] = field(default_factory=list)
    """Each check, the node with ``+`` when it ran the burn-in."""
    now: list[float] = field(default_factory=lambda: [1000.0])

    def check(self, node: str, *, burn_in: bool) -> NodeCheck:
        self.checked.append(node + ("+" if burn_in else ""))
        if node in self.raises:
            raise RuntimeError("srun: error: Unable to create step")
        agent = CheckResult("agent", True, "heartbeat 1.0 s ago")
        if node in self.silent:
            agent = CheckResult("agent", False, "its agent's last heartbeat is 9.0 s old")
        ok = node not in self.bad
        words = "step: 2 process(es), product and collective right" if ok else (
            "step (status 1): the matrix product was wrong")  # fmt: skip
        burned = CheckResult("burn-in", ok, words, 4.2) if burn_in and agent.ok else (
            CheckResult("burn-in", None, "not run"))  # fmt: skip
        return NodeCheck(node, self.now[0], (agent, burned), standing="job spare")


def _vetting(check: FakeCheck, journal: Any, max_age_s: float = 600.0) -> Vetting:
    return Vetting(check, journal, max_age_s=max_age_s, wall=lambda: check.now[0])


def _supervise(job: FakeJob, check: FakeCheck, tmp_path: Path, **kw: Any) -> Any:
    from recovery.inalloc.supervisor import SupervisorJournal

    journal = SupervisorJournal(tmp_path / "sup.jsonl")
    vetting = _vetting(check, journal, kw.pop("max_age_s", 600.0))
    decision, journal = _run(job, tmp_path, vetting=vetting, **kw)
    vetting.wait(5)
    return decision, journal


def _events(journal: Any, name: str) -> list[dict[str, Any]]:
    """The journal's ``name`` rows as written (the checks' rows come from their thread)."""
    rows = [json.loads(line) for line in journal.path.read_text().splitlines()]
    return [e for e in rows if e["event"] == name]


def test_a_spare_that_fails_its_check_is_held_out_and_the_next_one_takes_the_work(
    tmp_path: Path,
) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4", "n5"], [134, 0], faults={0: {"n3": "DOWN"}})
    check = FakeCheck(bad={"n4"})
    decision, journal = _supervise(job, check, tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n5"]]  # never on n4
    assert [n for n, _ in job.held] == ["n4"]
    assert job.held[0][1] == (
        "recover: check failed: burn-in: step (status 1): the matrix product was wrong"
    )
    assert job.released[0] == ["n1", "n2", "n5"]  # given back (n3 Slurm dropped itself)
    rejected = _events(journal, "spare-rejected")
    assert [(e["node"], e["held"]) for e in rejected] == [("n4", True)]
    # Burned in in the background while the first launch trained; n5 asked again (the
    # cheap checks) when the relaunch took it.
    assert check.checked == ["n4+", "n5+", "n1+", "n5"]
    verdicts = {e["node"]: e["verdict"] for e in _events(journal, "spare-checked")}
    assert verdicts == {"n4": "failed: burn-in", "n5": "passed", "n1": "passed"}
    assert _events(journal, "spare-checking")[0]["background"] is True


def test_without_background_checks_a_relaunch_checks_only_the_spares_it_takes(
    tmp_path: Path,
) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4", "n5"], [134, 0], faults={0: {"n3": "DOWN"}})
    check = FakeCheck(bad={"n4"})
    decision, journal = _supervise(job, check, tmp_path, standby_after_s=None)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n5"]]
    assert check.checked == ["n4+", "n5+"]  # n4 failed, so n5 in its place; n1 not needed
    assert [e["background"] for e in _events(journal, "spare-checking")] == [False, False]


def test_a_burn_in_older_than_max_age_is_made_again_at_the_relaunch(tmp_path: Path) -> None:
    check = FakeCheck()

    @dataclass
    class SlowJob(FakeJob):
        def launch(self, nodes: Any, command: Any) -> Any:
            check.now[0] += 40  # each launch runs 40 s
            return super().launch(nodes, command)

    job = SlowJob(["n1", "n2", "n3", "n4"], [134, 134, 0],
                  faults={0: {"n3": "DOWN"}, 1: {"n4": "DOWN"}})  # fmt: skip
    from recovery.inalloc.supervisor import SupervisorJournal

    vetting = _vetting(check, SupervisorJournal(tmp_path / "sup.jsonl"), max_age_s=60.0)
    vetting.start(["n4", "n1"])
    vetting.wait(5)
    decision, _journal = _run(job, tmp_path, vetting=vetting, standby_after_s=None)
    assert decision == Finish(0, "the training step completed")
    assert job.launches == [["n2", "n3"], ["n2", "n4"], ["n2", "n1"]]
    # At 40 s n4's burn-in is fresh (the cheap checks only); at 80 s n1's is not.
    assert check.checked == ["n4+", "n1+", "n4", "n1+"]


def test_a_spare_whose_agent_died_after_its_burn_in_is_rejected_at_the_relaunch(
    tmp_path: Path,
) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4", "n5"], [134, 0], faults={0: {"n3": "DOWN"}})
    check = FakeCheck()
    from recovery.inalloc.supervisor import SupervisorJournal

    vetting = _vetting(check, SupervisorJournal(tmp_path / "sup.jsonl"))
    vetting.start(["n4", "n5", "n1"])
    vetting.wait(5)
    check.silent.add("n4")  # its agent dies after the background check passed
    decision, _journal = _run(job, tmp_path, vetting=vetting, standby_after_s=None)
    assert decision == Finish(0, "the training step completed")
    assert job.launches[1] == ["n2", "n5"]
    assert job.held == [("n4", "recover: check failed: agent: its agent's last heartbeat "
                                "is 9.0 s old")]  # fmt: skip
    assert check.checked == ["n4+", "n5+", "n1+", "n4", "n5"]


def test_a_spare_slurm_will_not_let_the_job_drain_is_kept_unused(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4", "n5"], [134, 0], faults={0: {"n3": "DOWN"}},
                  refuse_hold=True)  # fmt: skip
    decision, journal = _supervise(job, FakeCheck(bad={"n4"}), tmp_path)
    assert decision == Finish(0, "the training step completed")
    assert job.launches[1] == ["n2", "n5"]
    assert job.held == []
    assert all("n4" in kept for kept in job.released)  # still the job's: no one else's
    (rejected,) = _events(journal, "spare-rejected")
    assert rejected["held"] is False
    assert "Slurm refused the drain" in rejected["why"]


def test_when_every_spare_fails_the_job_requeues_and_the_batch_host_is_not_drained(
    tmp_path: Path,
) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4"], [134], faults={0: {"n3": "DOWN"}})
    decision, journal = _supervise(job, FakeCheck(bad={"n4", "n1"}), tmp_path)
    assert isinstance(decision, Requeue)
    assert "0 spare(s) left" in decision.why
    assert [n for n, _ in job.held] == ["n4"]
    why = {e["node"]: e["held"] for e in _events(journal, "spare-rejected")}
    assert why == {"n4": True, "n1": False}  # n1 runs the batch script


def test_a_check_that_breaks_fails_the_spare_with_its_error(tmp_path: Path) -> None:
    job = FakeJob(["n1", "n2", "n3", "n4", "n5"], [134, 0], faults={0: {"n3": "DOWN"}})
    check = FakeCheck(raises={"n4"})
    decision, _journal = _supervise(job, check, tmp_path, standby_after_s=None)
    assert decision == Finish(0, "the training step completed")
    assert job.launches[1] == ["n2", "n5"]
    (held,) = job.held
    assert held == ("n4", "recover: check failed: check: the check itself failed: "
                          "srun: error: Unable to create step")  # fmt: skip
