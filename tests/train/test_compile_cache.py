"""Every process of a multi-process CPU run compiles through the persistent cache, not only
process 0 (recovery.train.compile_cache): a restarted process 1 loads its programs instead of
compiling them again, as process 0 does."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.train.multi import final_digest, run

#: What JAX logs, with JAX_EXPLAIN_CACHE_MISSES=1, for a program not found in the cache.
MISS = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)'")


def _programs(cache: Path) -> Counter[str]:
    """How many entries each program has in the cache directory (``jit_partial-<key>-cache``:
    several processes take each step as two programs, recovery/train/split_step.py)."""
    return Counter(p.name.split("-", 1)[0] for p in cache.iterdir() if p.name.endswith("-cache"))


@pytest.mark.slow
def test_each_process_writes_its_programs_and_a_restart_loads_them(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    run_dir = tmp_path / "run"
    first = run(run_dir, 2, 4, 2, "--compile-cache", str(cache))
    written = _programs(cache)
    assert {"jit_partial", "jit_apply", "jit_batch"} <= set(written), written
    # The keys differ between the processes on CPU: one entry each, not process 0's alone.
    assert set(written.values()) == {2}, written

    for log in first.logs:
        log.write_text("")
    again = run(
        run_dir, 2, 8, 2, "--resume", "--compile-cache", str(cache),
        env={"JAX_EXPLAIN_CACHE_MISSES": "1"},
    )  # fmt: skip
    missed = [set(MISS.findall(log.read_text())) for log in again.logs]
    assert not {"jit_partial", "jit_apply"} & (missed[0] | missed[1]), missed
    # Whatever the restart compiled that the first run had not, both processes compiled.
    assert missed[0] == missed[1], missed
    assert final_digest(run_dir, 2)
