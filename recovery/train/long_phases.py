"""The long phases ``recover train`` goes through when asked (:class:`LongPhases`: a slow
checkpoint save, an evaluation, a pause, a slow first step), each where and as a real loop
has it, so that the job's hang watcher can be seen to sit through it.

In a job of several processes process 0 alone saves slowly and evaluates, as a loop whose
process 0 writes or evaluates for everyone does: the others go on into the next step and
wait for it at the step's collective, in the step loop, past their own step budget, while
process 0 is in its announced phase. Every process pauses (a pause is the job's), and every
process's first step is slow (each compiles its own). None of them changes the state: the
run's digest is the digest of the same run without them.
"""

from __future__ import annotations

import time
from typing import Any

from recovery.api.preemption import Preemption
from recovery.progress import Phase
from recovery.train.options import LongPhases
from recovery.train.run import Run

#: Longest single sleep of a wait a preemption signal may cut short (seconds).
IDLE_SLICE_S = 0.1


def slow_save(run: Run) -> None:
    """Inside a periodic save's phase: process 0 spends ``save_delay`` seconds more, as a
    write to slow storage does (nothing cuts it short)."""
    delay = _asked(run).save_delay
    if delay and _lead(run):
        time.sleep(delay)


def slow_first_step(run: Run) -> None:
    """Inside the first step of this process's run (the watcher sees it in the step, not in a
    phase): ``first_step_delay`` seconds, as a loop that compiles in its first step takes."""
    delay = _asked(run).first_step_delay
    if delay:
        time.sleep(delay)


def between_steps(run: Run, state: Any, step: int) -> None:
    """After step ``step`` and its save, before the next step: process 0's evaluation when
    one is due, then every process's pause when ``step`` is the pause's."""
    asked = _asked(run)
    if step >= run.opts.steps:  # the run ends here: nothing is between
        return
    if asked.eval_every and step % asked.eval_every == 0 and _lead(run):
        with run.phase(Phase.evaluation):
            _evaluate(run, state, step, asked.eval_seconds)
    if asked.pause_at == step:
        with run.phase(Phase.paused):
            run.log(f"recover: paused after step {step} for {asked.pause_seconds:g} s")
            idle(asked.pause_seconds, run.preemption)


def _evaluate(run: Run, state: Any, step: int, seconds: float) -> None:
    """The held-out loss of ``state``'s parameters, from this process's own copy (no
    collective), logged; then idle until the evaluation has lasted ``seconds``."""
    import jax

    from recovery.checkpoint import tree
    from recovery.train import model as M

    t0 = time.monotonic()
    params = state["params"]
    host = tree.to_host(params)  # in the tree's order: the leaves in place
    local = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), list(host.values()))
    loss = float(M.make_held_out_loss(run.spec, run.opts.seed)(local))
    run.log(f"recover: evaluation after step {step}: held-out loss {loss:.4f}")
    idle(seconds - (time.monotonic() - t0), run.preemption)


def idle(seconds: float, preemption: Preemption) -> None:
    """Wait ``seconds`` (none when not positive), or less once ``preemption`` has a signal:
    the loop then stops after the step as usual."""
    until = time.monotonic() + seconds
    while not preemption.requested:
        left = until - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(IDLE_SLICE_S, left))


def _asked(run: Run) -> LongPhases:
    return run.opts.long_phases


def _lead(run: Run) -> bool:
    """This process is process 0 (or the only one)."""
    return run.ranks is None or run.ranks.rank == 0
