"""A tiny transformer language model in Flax and Optax that survives preemption, node loss
and restarts, using only ``recovery.api``.

    python examples/flax_lm/train.py --run-dir runs/lm --steps 60

Run it again with the same arguments and it continues from its newest checkpoint that
verifies; send it SIGTERM (or SIGUSR1) and it saves, then exits with 75; under
``recover sbatch -N K`` (or the ``RECOVER_*`` variables) it runs as K data-parallel
processes. It prints ``completed step N state_digest D`` at the end: equal digests mean
bit-identical final states, however often the run was interrupted.

The data is synthetic and a function of the step number alone (token sequences that follow
a fixed rule, so the loss falls), which is what makes a resumed run see exactly the batches
the uninterrupted one saw.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from recovery.api import (
    CheckpointManager,
    Preemption,
    UsageError,
    failing_together,
    join,
    leave,
    open_event_log,
)


class Block(nn.Module):
    """Pre-norm self-attention (causal) and an MLP, each with a residual connection."""

    heads: int
    width: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], dtype=jnp.int32))
        x = x + nn.SelfAttention(num_heads=self.heads, deterministic=True)(nn.LayerNorm()(x), mask)
        h = nn.Dense(4 * self.width)(nn.LayerNorm()(x))
        return x + nn.Dense(self.width)(nn.gelu(h))


class TinyLM(nn.Module):
    vocab: int
    width: int
    layers: int
    heads: int
    length: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(self.vocab, self.width)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (self.length, self.width))
        for _ in range(self.layers):
            x = Block(self.heads, self.width)(x)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def batch(step: int, *, size: int, length: int, vocab: int, seed: int) -> np.ndarray:
    """The global batch of ``step``: each sequence starts at a random token and follows
    ``t[i+1] = (3 t[i] + 1) mod vocab``, with one token in eight replaced by noise."""
    rng = np.random.default_rng([seed, step])
    tokens = np.empty((size, length + 1), dtype=np.int32)
    tokens[:, 0] = rng.integers(0, vocab, size)
    for i in range(length):
        tokens[:, i + 1] = (3 * tokens[:, i] + 1) % vocab
    noise = rng.random(tokens.shape) < 0.125
    tokens[noise] = rng.integers(0, vocab, int(noise.sum()))
    return tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="checkpoints and events.jsonl go here")
    parser.add_argument("--steps", type=int, default=60, help="train until this step")
    parser.add_argument("--save-every", type=int, default=10, help="checkpoint period, steps")
    parser.add_argument("--batch", type=int, default=16, help="global batch, sequences")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="seconds to wait after each step: a run slow enough to interrupt by hand",
    )
    args = parser.parse_args(argv)
    config = {"vocab": 64, "width": 32, "layers": 2, "heads": 2, "length": 16}
    run_config = {**config, "batch": args.batch, "seed": args.seed, "lr": 3e-3}

    events = open_event_log(args.run_dir)
    processes = join(events)  # None for one process; K processes: data parallel
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    if args.batch % jax.device_count():
        parser.error(f"--batch {args.batch} must divide over {jax.device_count()} devices")
    replicated = NamedSharding(mesh, P())
    by_rows = NamedSharding(mesh, P("data"))
    model = TinyLM(**config)

    @jax.jit  # one compiled program, not dozens of op-by-op dispatches
    def fresh_state() -> train_state.TrainState:
        tokens = jnp.zeros((1, config["length"]), dtype=jnp.int32)
        params = model.init(jax.random.PRNGKey(args.seed), tokens)
        return train_state.TrainState.create(
            apply_fn=model.apply, params=params, tx=optax.adamw(run_config["lr"])
        )

    def init_state() -> train_state.TrainState:
        # The same values on every process, placed on every device of the job.
        return jax.tree.map(lambda x: _placed(np.asarray(x), replicated), fresh_state())

    @functools.partial(jax.jit, donate_argnums=0)
    def train_step(state: train_state.TrainState, tokens: jax.Array) -> Any:
        def loss_fn(params: Any) -> jax.Array:
            logits = state.apply_fn(params, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    def data(step: int) -> jax.Array:
        return _placed(batch(step, size=args.batch, **_data_args(config, args.seed)), by_rows)

    manager = CheckpointManager(
        f"{args.run_dir}/checkpoints",
        run_config=run_config,
        keep_last=3,
        events=events,
        processes=processes,
    )
    preemption = Preemption()
    with failing_together(processes), manager, preemption.installed():
        manager.open()  # the run lock first (one writer per run), then announce the run
        events.emit("started", step=None, target_steps=args.steps)
        fresh = init_state()
        restored = manager.restore_or_none(fresh)
        state, step = (restored.state, restored.step) if restored else (fresh, 0)
        if step > args.steps:
            raise UsageError(f"--steps {args.steps} is behind the newest checkpoint ({step})")
        t = time.perf_counter()
        jax.block_until_ready(train_step.lower(state, data(step)).compile())
        events.emit("warmup", step=step, warmup_s=time.perf_counter() - t)
        while step < args.steps:
            t = time.perf_counter()
            state, loss = train_step(state, data(step))
            step += 1
            if processes is not None:
                processes.step = step
            events.emit("step", step=step, loss=float(loss), step_s=time.perf_counter() - t)
            if preemption.requested_by_any(processes):
                preemption.save_and_exit(manager, step, state)  # exits with 75
            if step % args.save_every == 0:
                manager.save(step, state)  # in the background
            if args.step_delay:
                time.sleep(args.step_delay)
        digest = manager.finalize(step, state)  # durable (saved unless it already was)
        events.emit("completed", step=step, state_digest=digest)
    leave(processes)
    print(f"completed step {step} state_digest {digest}", flush=True)
    return 0


def _data_args(config: dict[str, int], seed: int) -> dict[str, int]:
    return {"length": config["length"], "vocab": config["vocab"], "seed": seed}


def _placed(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """``value`` (the same on every process) as one array of the job, laid out by
    ``sharding``: each process supplies its own devices' parts."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


if __name__ == "__main__":
    sys.exit(main())
