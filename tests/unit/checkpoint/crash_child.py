"""Child process for the crash tests: resume like a training run, then save steps forever.

Run as ``python crash_child.py ROOT``. It takes the run lock, removes leftovers, restores the
newest checkpoint and saves the following steps until killed, printing ``ready <step>`` once
restored and ``saved <step>`` after each save returns (that step is durable then, and
retention has run). A retention error ends it with a message instead.
The parent imports :func:`content` (via runpy) to know what every step must contain.
"""

from __future__ import annotations

import os
import sys

import numpy as np

RUN_CONFIG = {"model": "crash-test", "lr": 0.1}
KEEP_LAST = 2


def content(step: int) -> dict[str, np.ndarray]:
    """About 3 MiB whose every byte is a function of ``step``."""
    rng = np.random.default_rng(step)
    return {
        "params/w": rng.standard_normal(512 * 1024, dtype=np.float32).reshape(512, 1024),
        "params/b": np.arange(128 * 1024, dtype=np.int64) * (step + 1),
        "opt/mu": np.full((64, 64), step, dtype=np.float16),
        "step": np.array(step, dtype=np.int64),
    }


def main(root: str) -> None:
    from recovery.checkpoint import CheckpointStore, RetentionPolicy, RunLock

    store = CheckpointStore(root, retention=RetentionPolicy(keep_last=KEEP_LAST))
    RunLock(root).acquire()  # released by the kernel when we are killed
    store.remove_leftovers()
    step = store.restore_latest(run_config=RUN_CONFIG).loaded.step
    # One write per report: under PYTHONUNBUFFERED print() writes each piece on its own, and a
    # kill between them left the parent a line without its number.
    os.write(1, f"ready {step}\n".encode())
    while True:
        step += 1
        result = store.save(step, content(step), run_config=RUN_CONFIG, metadata={"step": step})
        if result.retention_errors:  # never expected here: make the parent test fail
            sys.exit(f"retention failed after step {step}: {result.retention_errors}")
        os.write(1, f"saved {step}\n".encode())


if __name__ == "__main__":
    main(sys.argv[1])
