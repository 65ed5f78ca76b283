"""Each part runs without importing what its extra does not install: the agent without JAX,
numpy, matplotlib or the service stack; the coordinator without JAX or the device libraries;
training without the service stack; the report without JAX. Checked here, in one venv that has
everything, by the modules each part's process really loads (``tests/install/test_extras.py``
proves the same in clean venvs, slowly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recovery.climain import EXTRA_OF
from tests.install.parts import PARTS, ROOT, SAMPLE_KMSG, extras

# Imports every module of the part's packages, runs one command, prints the top-level
# modules the process loaded.
DRIVER = """
import importlib, json, pkgutil, sys
for name in {packages!r}:
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        if not info.name.endswith(".__main__"):  # runs a command when imported
            importlib.import_module(info.name)
from recover import main
rc = main({argv!r})
print("\\nMODULES " + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
sys.exit(rc)
"""


def loaded(packages: tuple[str, ...], argv: list[str], cwd: Path) -> set[str]:
    code = DRIVER.format(packages=packages, argv=argv)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
        check=False,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = proc.stdout.rsplit("\nMODULES ", 1)[1]
    return set(json.loads(line))


RUNS = {
    "agent": ["agent", "parse", str(SAMPLE_KMSG), "--json"],
    "coordinator": ["coordinator", "serve", "--help"],
    "training": [],  # filled in with a run directory below
    "report": ["report", "--help"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARTS))
def test_part_loads_nothing_its_extra_lacks(name: str, tmp_path: Path) -> None:
    part = PARTS[name]
    argv = RUNS[name] or [
        "train", "--run-dir", str(tmp_path / "run"), "--steps", "3", "--save-every", "2",
        "--no-compile-cache",
    ]  # fmt: skip
    modules = loaded(part.packages, argv, tmp_path)
    assert "recovery" in modules  # the check sees what was loaded
    if name == "training":
        assert "jax" in modules
    assert sorted(set(part.forbidden) & modules) == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    modules = loaded(("service.reportgen",), ["--help"], tmp_path)
    assert "matplotlib" in modules


def test_every_extra_a_message_names_exists() -> None:
    table = extras()
    assert set(EXTRA_OF.values()) <= set(table)
    assert {"agent", "coordinator", "training", "report", "orbax", "examples", "all"} <= set(table)
