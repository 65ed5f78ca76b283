# jax leaves ShapeDtypeStruct and PartitionSpec unannotated.
# mypy: disable-error-code="no-untyped-call"
"""One process of a 2-process job (launched by ``test_sharded.py`` with the ``RECOVER_*``
variables and 2 CPU devices each): a state whose arrays are sharded over all 4 devices of the
2 processes, typed PRNG keys among them, saved or restored through
``CheckpointManager(processes=...)``.

``python -m tests.api.sharded_worker save|restore RUN_DIR [LAYOUT]`` prints one JSON line:
the step and digest, and for ``restore`` whether every local shard holds the expected bytes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from recovery.api import CheckpointManager, failing_together, join, leave, open_event_log

STEP = 7
#: The keys' implementation; the state's ``k`` leaf holds 12 of them.
IMPL = "threefry2x32"


def expected() -> dict[str, np.ndarray]:
    """The global arrays, the same on every process."""
    rng = np.random.default_rng(3)
    return {
        "w": rng.standard_normal((8, 4)).astype(np.float32),
        "e": rng.standard_normal((4, 8)).astype(jnp.bfloat16),
        "n": np.arange(12, dtype=np.int8).reshape(12),
    }


def key_data() -> np.ndarray:
    """The data of the state's 12 keys (``uint32[12, 2]``), the same on every process."""
    return np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3, impl=IMPL), 12)))


def shardings(mesh: jax.sharding.Mesh, layout: str) -> dict[str, NamedSharding]:
    """``rows``: dimension 0 over all 4 devices; ``cols``: another split of the same arrays
    (a restore onto a different layout than the save's; the keys replicated)."""
    if layout == "rows":
        specs = {"w": P(("a", "b")), "e": P(("a", "b")), "n": P(("a", "b")), "k": P(("a", "b"))}
    else:
        specs = {"w": P("b", "a"), "e": P(None, ("a", "b")), "n": P(), "k": P()}
    return {k: NamedSharding(mesh, s) for k, s in specs.items()}


def placed(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """``value`` as an array of the job, each process supplying its own devices' parts."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def main(mode: str, run_dir: str, layout: str = "rows") -> None:
    events = open_event_log(run_dir)
    processes = join(events)
    assert processes is not None
    assert processes.size == 2
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
    assert len(jax.devices()) == 4
    assert len(jax.local_devices()) == 2
    want = expected()
    shard = shardings(mesh, layout)
    out: dict[str, Any] = {"rank": processes.rank}
    with failing_together(processes):
        manager = CheckpointManager(
            f"{run_dir}/checkpoints", run_config={"t": 1}, events=events, processes=processes
        )
        with manager:
            if mode == "save":
                state = {k: placed(v, shard[k]) for k, v in want.items()}
                state["k"] = jax.random.wrap_key_data(placed(key_data(), shard["k"]), impl=IMPL)
                assert not state["w"].is_fully_addressable  # each process holds half
                assert not state["k"].is_fully_addressable
                manager.save(STEP, state)
                result = manager.wait()
                assert result is not None
                out.update(step=result.step, digest=result.state_digest)
            else:
                template = {
                    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shard[k])
                    for k, v in want.items()
                }
                keys = jax.random.key(0, impl=IMPL).dtype
                template["k"] = jax.ShapeDtypeStruct((12,), keys, sharding=shard["k"])
                restored = manager.restore(template)
                arrays: dict[str, jax.Array] = restored.state  # type: ignore[assignment]
                ok = all(
                    np.array_equal(np.asarray(s.data), want[k][s.index])
                    and arrays[k].sharding == shard[k]
                    for k in want
                    for s in arrays[k].addressable_shards
                )
                # JAX spells a key array's layout with one entry per axis (P(None,) for
                # P()): the same layout, not an equal object.
                placed_as = arrays["k"].sharding.is_equivalent_to(shard["k"], 1)
                ok = ok and arrays["k"].dtype == keys and placed_as
                ok = ok and all(
                    np.array_equal(jax.random.key_data(s.data), key_data()[s.index])
                    for s in arrays["k"].addressable_shards
                )
                # Without shardings in the template: whole, on this process's own device
                # (process 1 cannot place anything on jax.devices()[0], process 0's).
                here = manager.restore(
                    {k: jax.ShapeDtypeStruct(t.shape, t.dtype) for k, t in template.items()}
                )
                local: dict[str, jax.Array] = here.state  # type: ignore[assignment]
                ok = ok and all(a.devices() == {jax.local_devices()[0]} for a in local.values())
                ok = ok and all(np.array_equal(np.asarray(local[k]), want[k]) for k in want)
                ok = ok and np.array_equal(jax.random.key_data(local["k"]), key_data())
                out.update(step=restored.step, digest=restored.state_digest, shards_ok=ok)
    print(json.dumps(out), flush=True)
    leave(processes)


if __name__ == "__main__":
    main(*sys.argv[1:])
