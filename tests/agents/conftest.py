"""Fixtures for the agent tests: a fake clock, a node name and a boot id; a live coordinator
API and agent processes for the end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from recovery.ports.clock import FakeClock
from tests.agents.live import AgentProcess, LiveCoordinator

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


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCoordinator]:
    """A running coordinator API (real uvicorn, real journal, fake engine)."""
    coordinator = LiveCoordinator(tmp_path)
    coordinator.start()
    try:
        yield coordinator
    finally:
        coordinator.close()


@pytest.fixture
def agents(tmp_path: Path, live: LiveCoordinator) -> Iterator[Callable[..., AgentProcess]]:
    """Starts agent processes (``agents(node, *extra_args, sources=...)``); every one still
    running at the end is killed by its pid, and the test fails if one cannot be reaped."""
    started: list[AgentProcess] = []

    def start(node: str, *extra: str, sources: str = "", kmsg_from: str = "start") -> AgentProcess:
        agent = AgentProcess(
            live, node, tmp_path, *extra, sources=sources, kmsg_from=kmsg_from
        ).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.kill()
        assert not agent.alive(), f"agent {agent.node} (pid {agent.proc and agent.proc.pid}) left"
