"""Suite-wide rules: tests marked ``gpu``/``tpu`` skip, with the reason, when none is present."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

# The real local Slurm cluster's and Kubernetes API server's fixtures (started only by tests
# that ask for them).
pytest_plugins = ["tests.plugins.slurm_cluster", "tests.plugins.kube_api"]


@functools.cache
def _accelerator(platform: str) -> str | None:
    """None if JAX sees a device of ``platform``, else the reason it does not."""
    try:
        import jax

        devices = jax.devices(platform)
    except Exception as e:  # jax raises RuntimeError for an unknown or absent backend
        return f"needs a {platform.upper()}: JAX found none ({type(e).__name__}: {e})"
    return None if devices else f"needs a {platform.upper()}: JAX found none"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for platform in ("gpu", "tpu"):
            if item.get_closest_marker(platform) is not None:
                reason = _accelerator(platform)
                if reason is not None:
                    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def control_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of scenario control runs (and of their JAX compilation) for the session, so
    each training configuration's uninterrupted run is trained once."""
    return tmp_path_factory.mktemp("control-runs")
