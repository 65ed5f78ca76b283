# jax leaves ShapeDtypeStruct and PartitionSpec unannotated.
# mypy: disable-error-code="no-untyped-call"
"""One process of a 2-process job (launched by ``test_sharded.py`` with the ``RECOVER_*``
variables and 2 CPU devices each): a state whose arrays are sharded over all 4 devices of the
2 processes, saved or restored through ``CheckpointManager(processes=...)``.

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


def expected() -> dict[str, np.ndarray]:
    """The global arrays, the same on every process."""
    rng = np.random.default_rng(3)
    return {
        "w": rng.standard_normal((8, 4)).astype(np.float32),
        "e": rng.standard_normal((4, 8)).astype(jnp.bfloat16),
        "n": np.arange(12, dtype=np.int8).reshape(12),
    }


def shardings(mesh: jax.sharding.Mesh, layout: str) -> dict[str, NamedSharding]:
    """``rows``: dimension 0 over all 4 devices; ``cols``: another split of the same arrays
    (a restore onto a different layout than the save's)."""
    if layout == "rows":
        specs = {"w": P(("a", "b")), "e": P(("a", "b")), "n": P(("a", "b"))}
    else:
        specs = {"w": P("b", "a"), "e": P(None, ("a", "b")), "n": P()}
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
                assert not state["w"].is_fully_addressable  # each process holds half
                manager.save(STEP, state)
                result = manager.wait()
                assert result is not None
                out.update(step=result.step, digest=result.state_digest)
            else:
                template = {
                    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shard[k])
                    for k, v in want.items()
                }
                restored = manager.restore(template)
                arrays: dict[str, jax.Array] = restored.state  # type: ignore[assignment]
                ok = all(
                    np.array_equal(np.asarray(s.data), want[k][s.index])
                    and arrays[k].sharding == shard[k]
                    for k in want
                    for s in arrays[k].addressable_shards
                )
                out.update(step=restored.step, digest=restored.state_digest, shards_ok=ok)
    print(json.dumps(out), flush=True)
    leave(processes)


if __name__ == "__main__":
    main(*sys.argv[1:])
