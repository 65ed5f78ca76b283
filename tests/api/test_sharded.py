"""Arrays sharded over 2 processes x 2 CPU devices, typed PRNG keys among them, saved and
restored through ``CheckpointManager(processes=...)`` with real ``jax.distributed`` (gloo)
between two real processes: one checkpoint holding the whole arrays, restored onto the same
and onto another layout, every process's shards holding the saved bytes (the keys' shards
the same keys)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recovery.api import CheckpointManager, read_events
from recovery.multiproc import free_port
from tests.api.sharded_worker import IMPL, STEP, expected, key_data


def run_pair(mode: str, run_dir: Path, layout: str = "rows") -> list[dict[str, Any]]:
    """Both processes of one launch; each one's JSON line, in rank order."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "JAX_PLATFORMS": "cpu",
            "RECOVER_NUM_PROCESSES": "2",
            "RECOVER_PROCESS_ID": str(rank),
            "RECOVER_RENDEZVOUS": f"127.0.0.1:{port}",
        }
        cmd = [sys.executable, "-m", "tests.api.sharded_worker", mode, str(run_dir), layout]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=240)
            assert p.returncode == 0, f"exit {p.returncode}\n{stderr.decode()[-3000:]}"
            outs.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.slow
def test_sharded_state_saves_once_and_restores_onto_any_layout(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    saved = run_pair("save", run_dir)
    assert [o["step"] for o in saved] == [STEP, STEP]
    assert saved[0]["digest"] == saved[1]["digest"]
    # One checkpoint, holding the whole arrays (each process held only its half).
    reader = CheckpointManager(run_dir / "checkpoints", run_config={"t": 1}, read_only=True)
    assert reader.steps() == [STEP]
    reader.verify(STEP)
    arrays = reader.restore_arrays().state
    for name, want in expected().items():
        assert arrays[name].dtype == want.dtype
        np.testing.assert_array_equal(arrays[name], want)
    np.testing.assert_array_equal(arrays["k"], key_data())  # the keys, as their data
    manifest = json.loads(
        (run_dir / "checkpoints" / f"step_{STEP:08d}" / "manifest.json").read_text()
    )
    assert {leaf["path"]: leaf.get("key_impl") for leaf in manifest["leaves"]}["k"] == IMPL
    for layout in ("rows", "cols"):
        restored = run_pair("restore", run_dir, layout)
        assert [o["step"] for o in restored] == [STEP, STEP]
        assert {o["digest"] for o in restored} == {saved[0]["digest"]}
        assert all(o["shards_ok"] for o in restored), restored
    # Each process logged to its own file: the joined and checkpoint events the report reads.
    for name in ("events.jsonl", "events.rank1.jsonl"):
        kinds = [e["event"] for e in read_events(run_dir / name)]
        assert kinds.count("joined") == 3
        assert "checkpoint" in kinds
        assert "restored" in kinds
