"""Each extra, installed from a wheel of this tree into a clean venv, runs its part and holds
none of the other parts' packages: the agent parses a kernel log (no JAX, numpy, matplotlib or
kubernetes), the coordinator serves the local Slurm cluster in dry run and answers its health
check (no JAX), training runs ``recover train`` and the library API (no service stack), and
``all`` lists the scenarios.

Slow: each venv is a real ``pip install`` from PyPI (pip's cache makes repeats cheaper), so only
``training`` is in the whole tier; the other extras are in the soak tier (``--soak``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm.cluster import LocalCluster
from tests.install.parts import PARTS, ROOT, SAMPLE_KMSG

pytestmark = pytest.mark.slow

_SKIP = {".git", ".venv", "build", "runs", ".state", "__pycache__", ".mypy_cache",
         ".ruff_cache", ".pytest_cache"}  # fmt: skip


def sh(
    *argv: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, check=False,
        env=env, cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built from a copy (the build writes into its source folder)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(
        ROOT, src,
        ignore=lambda _, names: [n for n in names if n in _SKIP or n.endswith(".egg-info")],
    )  # fmt: skip
    out = base / "dist"
    built = sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src)
    assert built.returncode == 0, built.stderr
    (whl,) = out.glob("slurm_k8s_recover-*.whl")
    return whl


def venv_with(extra: str, wheel: Path, where: Path) -> Path:
    """A fresh venv holding ``wheel[extra]`` and what it depends on; its bin directory."""
    made = sh(sys.executable, "-m", "venv", where)
    assert made.returncode == 0, made.stderr
    pip = sh(where / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[{extra}]")
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-4000:]
    return where / "bin"


def installed(bin_dir: Path) -> set[str]:
    listed = sh(bin_dir / "python", "-m", "pip", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    return {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}


def clean_env(bin_dir: Path) -> dict[str, str]:
    """Nothing of this venv's: the venv's own bin first, no PYTHONPATH."""
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**keep, "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "JAX_PLATFORMS": "cpu"}


@pytest.fixture
def part_venv(request: pytest.FixtureRequest, wheel: Path, tmp_path: Path) -> Path:
    extra: str = request.param
    bin_dir = venv_with(extra, wheel, tmp_path / f"venv-{extra}")
    have = installed(bin_dir)
    assert "slurm-k8s-recover" in have
    if extra in PARTS:
        assert sorted(set(PARTS[extra].absent) & have) == []
    return bin_dir


@pytest.mark.soak
@pytest.mark.parametrize("part_venv", ["agent"], indirect=True)
def test_agent_extra_parses_a_kernel_log(part_venv: Path, tmp_path: Path) -> None:
    env = clean_env(part_venv)
    parsed = sh(part_venv / "recover", "agent", "parse", SAMPLE_KMSG, "--json", env=env,
                cwd=tmp_path)  # fmt: skip
    assert parsed.returncode == 0, parsed.stderr
    events = json.loads(parsed.stdout)
    assert any(e.get("fault") == "xid79" for e in events), events
    # Another part's command says which extra it needs, instead of a traceback.
    train = sh(part_venv / "recover", "train", "--run-dir", tmp_path / "r", "--steps", "2",
               "--save-every", "1", env=env, cwd=tmp_path)  # fmt: skip
    assert train.returncode == 2
    assert "pip install 'slurm-k8s-recover[training]'" in train.stderr


@pytest.mark.slurm
@pytest.mark.soak
@pytest.mark.parametrize("part_venv", ["coordinator"], indirect=True)
def test_coordinator_extra_serves_and_answers_its_health_check(
    part_venv: Path, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    state_dir = tmp_path / "coordinator"
    code = (
        "import httpx, sys\n"
        "from pathlib import Path\n"
        "from service.daemons import coordinator as c\n"
        f"state = Path({str(state_dir)!r})\n"
        f"ep = c.start(state, slurm_conf=Path({str(local_cluster.conf_path)!r}), dry_run=True,"
        " timeout_s=120)\n"
        "try:\n"
        "    r = httpx.get(ep.url + '/healthz', timeout=10)\n"
        "    print('HEALTH', r.status_code, 'jax' in sys.modules)\n"
        "finally:\n"
        "    assert c.stop(state)\n"
    )
    ran = sh(part_venv / "python", "-c", code, env=clean_env(part_venv), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "HEALTH 200 False" in ran.stdout


@pytest.mark.parametrize("part_venv", ["training"], indirect=True)
def test_training_extra_trains_and_uses_the_api(part_venv: Path, tmp_path: Path) -> None:
    env = clean_env(part_venv)
    run = tmp_path / "run"
    trained = sh(part_venv / "recover", "train", "--run-dir", run, "--steps", "4",
                 "--save-every", "2", env=env, cwd=tmp_path)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "completed step 4" in trained.stdout
    verified = sh(part_venv / "recover", "checkpoint", "verify", run, env=env, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    code = (
        "import jax.numpy as jnp, sys\n"
        "from recovery.api import CheckpointManager\n"
        f"m = CheckpointManager({str(run / 'checkpoints')!r}, read_only=True)\n"
        "config = m.info(m.latest_step()).run_config\n"  # recover train's configuration
        f"m = CheckpointManager({str(run / 'checkpoints')!r}, read_only=True, run_config=config)\n"
        "r = m.restore_arrays()\n"
        "assert r.step == 4, r.step\n"
        f"with CheckpointManager({str(tmp_path / 'mine')!r}, async_save=True) as mine:\n"
        "    mine.save(1, {'w': jnp.arange(3.0)})\n"
        "    print('API', mine.restore({'w': jnp.zeros(3)}).state['w'].tolist())\n"
    )
    api = sh(part_venv / "python", "-c", code, env=env, cwd=tmp_path)
    assert api.returncode == 0, api.stderr
    assert "API [0.0, 1.0, 2.0]" in api.stdout


@pytest.mark.soak
@pytest.mark.parametrize("part_venv", ["all"], indirect=True)
def test_all_extra_lists_the_scenarios(part_venv: Path, tmp_path: Path) -> None:
    have = installed(part_venv)
    for dist in ("jax", "matplotlib", "kubernetes", "fastapi", "nvidia-ml-py", "flax", "optax",
                 "orbax-checkpoint"):  # fmt: skip
        assert dist in have, dist
    listed = sh(part_venv / "recover", "scenario", "list", env=clean_env(part_venv), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "xid79" in listed.stdout
