"""A training loop written the way ``docs/library.md`` tells users to: ``recovery.api`` for
checkpoints, preemption, processes and the event log, and nothing else of the toolkit. The
behaviour suite (``test_trainers.py``) holds it to the same behaviour as ``recover train``.

    python tests/behaviour/user_loop.py --run-dir D --steps N --save-every K
        [--keep-last L] [--sync-save] [--step-sleep S]

Run again with the same arguments, it continues from its newest checkpoint that verifies;
SIGTERM or SIGUSR1: it saves and exits 75; under the ``RECOVER_*`` variables it is one of
several processes. Ends with ``completed step N state_digest D`` on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from recovery.api import (
    CheckpointManager,
    Preemption,
    failing_together,
    join,
    leave,
    open_event_log,
)

WIDTH = 16


def init(seed: int) -> dict[str, Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "w1": jax.random.normal(k1, (WIDTH, WIDTH)) * 0.3,
        "w2": jax.random.normal(k2, (WIDTH, 1)) * 0.3,
        "step": jnp.int32(0),
    }


@jax.jit
def train_step(state: dict[str, Any]) -> tuple[dict[str, Any], jax.Array]:
    """One SGD update on a batch that depends only on the step (a resumed run sees the same)."""
    x = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(7), state["step"]), (32, WIDTH))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def loss_fn(params: dict[str, Any]) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)

    params = {k: state[k] for k in ("w1", "w2")}
    loss, grads = jax.value_and_grad(loss_fn)(params)
    new = {k: params[k] - 0.05 * grads[k] for k in params}
    return {**new, "step": state["step"] + 1}, loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--sync-save", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    events = open_event_log(args.run_dir)
    processes = join(events)  # None for one process
    manager = CheckpointManager(
        f"{args.run_dir}/checkpoints",
        run_config={"model": "user-loop", "width": WIDTH, "seed": args.seed},
        keep_last=args.keep_last,
        async_save=not args.sync_save,
        events=events,
        processes=processes,
        log=log,
    )
    preemption = Preemption()
    with failing_together(processes), manager, preemption.installed():
        removed = manager.open()  # the run lock first: then announce the run
        events.emit("started", step=None, target_steps=args.steps, removed_leftovers=removed)
        fresh = init(args.seed)
        restored = manager.restore_or_none(fresh)
        state = restored.state if restored else fresh
        step = int(state["step"])
        while step < args.steps:
            t = time.perf_counter()
            state, loss = train_step(state)
            step += 1
            if processes is not None:
                processes.step = step
            events.emit("step", step=step, loss=float(loss), step_s=time.perf_counter() - t)
            if preemption.requested_by_any(processes):
                preemption.save_and_exit(manager, step, state)  # exits with 75
            if step % args.save_every == 0 and step < args.steps:
                manager.save(step, state)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        digest = manager.finalize(step, state)
        events.emit("completed", step=step, state_digest=digest)
    leave(processes)
    print(f"completed step {step} state_digest {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
