"""Fixtures for the agent tests: a fake clock, a node name and a boot id."""

from __future__ import annotations

import pytest

from recovery.ports.clock import FakeClock

NODE = "gpu-n3"
BOOT = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def node() -> str:
    return NODE


@pytest.fixture
def boot() -> str:
    return BOOT
