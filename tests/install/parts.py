"""The parts an install can hold, and what each may and may not bring in.

One table for both install tests: ``test_lazy`` checks, in this venv, that running a part
imports none of the packages it must not need; ``test_extras`` installs each extra into a clean
venv and checks that those packages are not even there.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_KMSG = ROOT / "tests" / "agents" / "samples" / "incident.dmesg"

JAX = ("jax", "jaxlib", "ml_dtypes")
SERVICE = ("fastapi", "starlette", "uvicorn", "kubernetes")
DEVICE = ("pynvml", "grpc", "tpu_info")
EXTRAS_ONLY = ("orbax", "flax", "optax")
COORDINATOR_PACKAGES = (
    "service.startup",
    "service.httpapi",
    "recovery.coordinator",
    "service.journaldb",
    "service.daemons",
    "recovery.policy",
    "k8s",
    "slurm",
)


@dataclass(frozen=True)
class Part:
    extra: str
    packages: tuple[str, ...]
    """Our packages whose every module the part may import."""
    forbidden: tuple[str, ...]
    """Import names the part must never load (its extra does not install them)."""
    absent: tuple[str, ...]
    """Distributions a clean install of the extra must not hold."""


PARTS = {
    "agent": Part(
        "agent",
        ("agents",),
        (*JAX, "numpy", "xxhash", "matplotlib", *SERVICE, *EXTRAS_ONLY),
        ("jax", "jaxlib", "numpy", "matplotlib", "kubernetes", "fastapi", "uvicorn"),
    ),
    "coordinator": Part(
        "coordinator",
        COORDINATOR_PACKAGES,
        (*JAX, "numpy", "xxhash", "matplotlib", *DEVICE, *EXTRAS_ONLY),
        ("jax", "jaxlib", "matplotlib", "nvidia-ml-py", "grpcio"),
    ),
    "training": Part(
        "training",
        ("recovery.train", "recovery.checkpoint", "recovery.api"),
        ("matplotlib", *SERVICE, "prometheus_client", *DEVICE, *EXTRAS_ONLY),
        ("fastapi", "uvicorn", "kubernetes", "prometheus-client", "matplotlib", "grpcio"),
    ),
    "report": Part(
        "report",
        ("recovery.report", "service.reportgen"),
        (*JAX, "xxhash", *SERVICE, *DEVICE, *EXTRAS_ONLY),
        ("jax", "jaxlib", "kubernetes", "fastapi", "uvicorn"),
    ),
}


def extras() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        table: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return table
