# jax leaves some public functions unannotated (PartitionSpec, ShapeDtypeStruct, ...).
# mypy: disable-error-code="no-untyped-call"
"""A small Flax NNX model trained with Optax that survives preemption, node loss and
restarts, using only ``recovery.api``.

    python examples/nnx_regression/train.py --run-dir runs/nnx --steps 40

Run it again with the same arguments and it continues from its newest checkpoint that
verifies; send it SIGTERM (or SIGUSR1) and it saves, then exits with 75; under
``recover sbatch -N K`` (or the ``RECOVER_*`` variables) it runs as K data-parallel
processes. It prints ``completed step N state_digest D`` at the end: equal digests mean
bit-identical final states, however often the run was interrupted.

The training state is one pytree: ``nnx.split`` of the model and its ``nnx.Optimizer``, so
parameters, batch statistics, the optimizer's moments and the ``nnx.Rngs`` dropout stream
(a typed PRNG key and its count) are saved and restored together, as they are. The step is
a pure jitted function of that state (``nnx.merge`` inside), which lets it donate the state
and keep it replicated over every device of the job.

Placing a restored state on the devices of several processes (``--place``): ``template``
(the default) hands ``restore`` a template whose leaves carry the job's replicated sharding
(``jax.eval_shape`` of the jitted initialiser: nothing is allocated), and the restore places
every leaf that way. ``local`` restores onto this process's own device and then makes each
leaf one array of the job with ``jax.make_array_from_process_local_data``, for a state that
is already in hand. ``jax.device_put(state, replicated)`` is not a way: with several
processes it refuses the typed keys (a sharding over devices this process cannot address),
and for the other leaves it is a collective that compares every process's value.

The data is synthetic and a function of the step number alone, which is what makes a
resumed run see exactly the batches the uninterrupted one saw.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]
from flax import nnx
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

FEATURES = 8
#: The training state: ``nnx.split``'s state of the model and its optimizer.
State = nnx.State[Any, Any]


class Regressor(nnx.Module):
    """Dense, batch norm, dropout, dense: parameters, running statistics and a random
    stream, every kind of state an NNX model holds."""

    def __init__(self, width: int, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(FEATURES, width, rngs=rngs)
        self.norm = nnx.BatchNorm(width, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.drop(nnx.gelu(self.norm(self.hidden(x)))))


def batch(step: int, *, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``: inputs, and targets a smooth function of them."""
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((size, FEATURES)).astype(np.float32)
    y = np.sin(x @ np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32))[:, None]
    return x, y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="checkpoints and events.jsonl go here")
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--save-every", type=int, default=10, help="checkpoint period, steps")
    parser.add_argument("--batch", type=int, default=32, help="global batch, examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--place",
        choices=("template", "local"),
        default="template",
        help="how a restored state reaches the job's devices (see the module's docstring)",
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="seconds to wait after each step: a run slow enough to interrupt by hand",
    )
    args = parser.parse_args(argv)
    run_config = {"width": 32, "batch": args.batch, "seed": args.seed, "lr": 1e-2}

    events = open_event_log(args.run_dir)
    processes = join(events)  # None for one process; K processes: data parallel
    if args.batch % jax.device_count():
        parser.error(f"--batch {args.batch} must divide over {jax.device_count()} devices")
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    by_rows = NamedSharding(mesh, P("data"))

    def build() -> dict[str, Any]:
        model = Regressor(run_config["width"], nnx.Rngs(args.seed, dropout=args.seed + 1))
        tx = optax.adamw(run_config["lr"])
        return {"model": model, "optimizer": nnx.Optimizer(model, tx, wrt=nnx.Param)}

    graphdef, _ = nnx.split(nnx.eval_shape(build))

    # One compiled program; every leaf comes out replicated over the job's devices.
    @functools.partial(jax.jit, out_shardings=replicated)
    def init() -> State:
        return nnx.split(build())[1]

    @functools.partial(jax.jit, donate_argnums=0, out_shardings=replicated)
    def train_step(state: State, x: jax.Array, y: jax.Array) -> tuple[State, jax.Array]:
        nodes = nnx.merge(graphdef, state)
        model, optimizer = nodes["model"], nodes["optimizer"]

        def loss_fn(model: Regressor) -> jax.Array:
            return jnp.mean((model(x) - y) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.split(nodes)[1], loss

    def data(step: int) -> tuple[jax.Array, jax.Array]:
        # Each process hands over only its own rows of the global batch.
        x, y = batch(step, size=args.batch, seed=args.seed)
        rows = args.batch // jax.process_count()
        mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        return (
            jax.make_array_from_process_local_data(by_rows, x[mine], x.shape),
            jax.make_array_from_process_local_data(by_rows, y[mine], y.shape),
        )

    def restore(manager: CheckpointManager) -> tuple[State, int] | None:
        shapes = jax.eval_shape(init)  # the state's leaves with their shardings; no memory
        if args.place == "template":
            restored = manager.restore_or_none(shapes)  # placed replicated, keys included
            return (restored.state, restored.step) if restored else None
        # This process's device first (a template without shardings), then one array of
        # the job per leaf, from the copy every process holds.
        here = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), shapes)
        restored = manager.restore_or_none(here)
        if restored is None:
            return None
        place = functools.partial(jax.make_array_from_process_local_data, replicated)
        return jax.tree.map(place, restored.state), restored.step

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
        state, step = restore(manager) or (init(), 0)
        if step > args.steps:
            raise UsageError(f"--steps {args.steps} is behind the newest checkpoint ({step})")
        t = time.perf_counter()
        jax.block_until_ready(train_step.lower(state, *data(step)).compile())
        events.emit("warmup", step=step, warmup_s=time.perf_counter() - t)
        while step < args.steps:
            t = time.perf_counter()
            state, loss = train_step(state, *data(step))
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


if __name__ == "__main__":
    sys.exit(main())
