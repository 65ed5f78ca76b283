"""The burn-in a node runs before work lands on it: ``python -m recovery.train.burnin``.

Each process (one per task of the burn-in job's step) multiplies two integer-valued matrices
on its first device and compares the product with the one computed exactly in integers on the
host: a device that computes wrong (a bad chip, a corrupt memory) fails here instead of in a
job. With ``--processes`` > 1 the processes then join JAX's distributed runtime (at
``--coordinator``, or ``RECOVER_RENDEZVOUS``) and gather a value from each: a node that cannot
join a collective fails too.

Prints one JSON line per process (``{"process": r, "ok": ..., "matmul_s": ..., ...}``) and
exits 0 when it passed, 1 when a result was wrong, 2 when the collective failed, 3 when JAX
could not start, 4 when it saw another number of accelerators than ``--expect-devices``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

EXIT_WRONG = 1
EXIT_COLLECTIVE = 2
EXIT_NO_JAX = 3
EXIT_DEVICES = 4


def operands(size: int) -> tuple[Any, Any, Any]:
    """Two ``size`` x ``size`` float32 matrices of small integers and their exact product
    (int64). Every partial sum stays below 2**24, so float32 computes it exactly: any
    difference is the device's error, not rounding."""
    import numpy as np

    i = np.arange(size, dtype=np.int64)[:, None]
    j = np.arange(size, dtype=np.int64)[None, :]
    a = (i + 2 * j) % 7
    b = (3 * i + j) % 5
    return a.astype(np.float32), b.astype(np.float32), a @ b


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m recovery.train.burnin", description=__doc__)
    p.add_argument("--size", type=int, default=256, help="matrix size (at most 4096)")
    p.add_argument("--rounds", type=int, default=3, help="products computed and checked")
    p.add_argument("--processes", type=int, default=int(os.environ.get("SLURM_NTASKS", "1")))
    p.add_argument("--process-id", type=int, default=int(os.environ.get("SLURM_PROCID", "0")))
    p.add_argument(
        "--coordinator", default=os.environ.get("RECOVER_RENDEZVOUS", ""),
        help="HOST:PORT of process 0 (needed with --processes > 1)",
    )  # fmt: skip
    p.add_argument("--timeout", type=int, default=60, help="seconds to join the collective")
    p.add_argument(
        "--expect-devices", type=int, default=0,
        help="accelerators each process must see (GPUs, TPU chips); 0: any. Not checked on "
        "a CPU-only node",
    )  # fmt: skip
    args = p.parse_args(argv)
    if not 1 <= args.size <= 4096 or args.rounds < 1 or args.processes < 1:
        p.error("--size must be 1..4096, --rounds and --processes >= 1")
    if args.processes > 1 and not args.coordinator:
        p.error("--processes > 1 needs --coordinator HOST:PORT (or RECOVER_RENDEZVOUS)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    out: dict[str, Any] = {"process": args.process_id, "processes": args.processes}

    def say(code: int, **more: Any) -> int:
        out.update(more, ok=code == 0, exit=code)
        print(json.dumps(out), flush=True)
        return code

    start = time.monotonic()
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np

        if args.processes > 1:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.config.update("jax_enable_preemption_service", False)
            jax.distributed.initialize(
                coordinator_address=args.coordinator,
                num_processes=args.processes,
                process_id=args.process_id,
                initialization_timeout=args.timeout,
            )
        devices = jax.local_devices()
        device = devices[0]
    except Exception as e:  # any failure to bring JAX up is the verdict
        return say(EXIT_NO_JAX, error=f"JAX did not start: {type(e).__name__}: {e}")
    out.update(
        device=str(device), platform=device.platform, devices=len(devices),
        startup_s=_since(start),
    )  # fmt: skip
    want = args.expect_devices
    if want and device.platform != "cpu" and len(devices) != want:
        return say(
            EXIT_DEVICES,
            error=f"{len(devices)} {device.platform} device(s) visible, {want} expected",
        )

    a, b, want = operands(args.size)
    product = jax.jit(jnp.matmul)
    t = time.monotonic()
    for round_ in range(args.rounds):
        got = np.asarray(product(jax.device_put(a, device), jax.device_put(b, device)))
        wrong = int(np.count_nonzero(got.astype(np.int64) != want))
        if wrong:
            return say(
                EXIT_WRONG,
                error=f"the product was wrong in {wrong} of {want.size} entries "
                f"(round {round_ + 1})",
            )
    out["matmul_s"] = _since(t)

    if args.processes > 1:
        from jax.experimental import multihost_utils

        t = time.monotonic()
        try:
            mine = np.array([args.process_id + 1], dtype=np.int32)
            every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1)
        except Exception as e:
            return say(EXIT_COLLECTIVE, error=f"the collective failed: {type(e).__name__}: {e}")
        expected = list(range(1, args.processes + 1))
        if sorted(int(v) for v in every) != expected:
            return say(
                EXIT_COLLECTIVE,
                error=f"the collective gathered {every.tolist()}, expected {expected}",
            )
        out["collective_s"] = _since(t)
        jax.distributed.shutdown()
    return say(0, total_s=_since(start))


def _since(t: float) -> float:
    return round(time.monotonic() - t, 3)


if __name__ == "__main__":
    sys.exit(main())
