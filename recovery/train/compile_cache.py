"""JAX's persistent compilation cache, for every process of a multi-process CPU run.

JAX writes a compiled program to its cache only from process 0 (so that many hosts do not race
on one shared directory). On the CPU backend the cache key of a multi-process program differs
from one process to the next, so the entries process 0 writes serve process 0 alone: every
other process compiled every program again on every start, cache or not. Measured on a
2-core VM, K=4 processes of mlp-tiny: processes 1-3 spent about 2.1 s compiling the train step
after a relaunch while process 0 loaded its own in well under a second, and everyone waited
for the slowest at the first collective.

:func:`every_process_writes` lets each process write its own entries (the keys differ, so no
two processes write the same file). It is only applied where that is what happens: several
processes on the CPU backend. On GPU the keys are the same for every process (JAX strips the
device assignment from them) and process 0's entries already serve all; a JAX without the
state this relies on gets JAX's own behaviour.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def use(directory: Path | None) -> None:
    """Compile through the persistent cache in ``directory`` (None: no cache)."""
    if directory is None:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Our programs compile in well under the default 1 s threshold; cache them anyway.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@contextmanager
def every_process_writes(processes: int) -> Iterator[bool]:
    """Within the block, this process writes its own compiled programs to the persistent
    cache as process 0 does. Yields whether that applies (several processes on CPU). Call
    once JAX's distributed runtime is up: JAX reads the process id when it writes."""
    import jax

    state = _distributed_state()
    if processes < 2 or state is None or jax.default_backend() != "cpu":
        yield False
        return
    real = state.process_id
    state.process_id = 0  # read only by the cache's "only process 0 writes" check on CPU
    try:
        yield True
    finally:
        state.process_id = real


def _distributed_state() -> Any | None:
    try:
        from jax._src import distributed
    except ImportError:
        return None
    state = getattr(distributed, "global_state", None)
    return state if state is not None and hasattr(state, "process_id") else None
