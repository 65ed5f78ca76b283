"""Suite-wide rules: tests marked ``gpu``/``tpu`` skip, with the reason, when none is present;
under CI (``$CI`` set) every other skip is a failure, since a tier that skips there is a tier
nobody ran. Tests marked ``soak`` run only with ``--soak`` (README, "Tests": the tiers)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The real local Slurm cluster's and Kubernetes API server's fixtures, and the session's one
# `recover demo` run (each started only by tests that ask for it).
pytest_plugins = [
    "tests.plugins.slurm_cluster",
    "tests.plugins.kube_api",
    "tests.plugins.postgres",
    "tests.plugins.demo_run",
]


@functools.cache
def _accelerator(platform: str) -> str | None:
    """None if JAX sees a device of ``platform``, else the reason it does not."""
    try:
        import jax

        devices = jax.devices(platform)
    except Exception as e:  # jax raises RuntimeError for an unknown or absent backend
        return f"needs a {platform.upper()}: JAX found none ({type(e).__name__}: {e})"
    return None if devices else f"needs a {platform.upper()}: JAX found none"


def pytest_configure(config: pytest.Config) -> None:
    # Training processes register their progress records for the node agents
    # (recovery.progress.registry). Each test process, and what it starts (agents, jobs),
    # uses its own registry: agents of one worker's cluster never judge another worker's jobs
    # with the same node names, and nothing is left in /run/recover/progress.
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    os.environ["RECOVER_PROGRESS_REGISTRY"] = f"/tmp/recover-progress-{os.getpid()}-{worker}"


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    registry = os.environ.get("RECOVER_PROGRESS_REGISTRY", "")
    if registry.startswith(f"/tmp/recover-progress-{os.getpid()}-"):
        shutil.rmtree(registry, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="also run the soak tier (tests marked soak: the long kill loops, the whole "
        "scenario matrix, the image builds); without it they are deselected",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--soak"):
        soak = [i for i in items if i.get_closest_marker("soak") is not None]
        if soak:
            config.hook.pytest_deselected(items=soak)
            items[:] = [i for i in items if i.get_closest_marker("soak") is None]
    for item in items:
        for platform in ("gpu", "tpu"):
            if item.get_closest_marker(platform) is not None:
                reason = _accelerator(platform)
                if reason is not None:
                    item.add_marker(pytest.mark.skip(reason=reason))


#: Markers whose tests may skip under CI: CI machines have no accelerator, and run in a
#: container without systemd-journald.
MAY_SKIP_IN_CI = ("gpu", "tpu", "journald")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not (report.skipped and os.environ.get("CI")) or hasattr(report, "wasxfail"):
        return
    if any(item.get_closest_marker(m) is not None for m in MAY_SKIP_IN_CI):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI, which counts as a failure (CI must run every tier but the "
        f"accelerator ones): {reason}"
    )


@pytest.fixture(scope="session")
def control_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of scenario control runs (and of their JAX compilation) for the session, so
    each training configuration's uninterrupted run is trained once. Under pytest-xdist the
    workers share it (each has its own temp folder inside one common one): the cache renames
    each finished run into place, so two workers computing the same control never clash."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = root / "control-runs"
    cache.mkdir(exist_ok=True)
    return cache
