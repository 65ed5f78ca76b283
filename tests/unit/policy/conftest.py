"""Fixtures for the policy tests (helpers live in ``helpers.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from recovery.policy import Catalogue, load_catalogue

from .helpers import Run


@pytest.fixture(scope="session")
def catalogue() -> Catalogue:
    return load_catalogue()


@pytest.fixture
def make_run(catalogue: Catalogue) -> Callable[..., Run]:
    """``make_run(config=..., view=...)`` -> a fresh :class:`Run`."""

    def make(**kw: Any) -> Run:
        return Run(catalogue, **kw)

    return make


@pytest.fixture
def run(make_run: Callable[..., Run]) -> Run:
    """A run with the default settings on a 4-node partition with one spare."""
    return make_run()
