"""Fixtures of the scenario tests: one control-run cache (and JAX compilation cache) for the
whole session, so each training configuration's control run is computed once."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def control_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("control-runs")
