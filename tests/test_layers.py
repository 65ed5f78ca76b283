"""The layering rules, checked on the source.

What may import what is declared once, as import-linter contracts in pyproject.toml
(``[tool.importlinter]``); these tests run that check, prove it catches a broken rule, and make
sure no module under recovery/ escapes it. What import-linter cannot see (a Slurm argv built
outside slurm/) is checked on the AST here.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("recovery", "slurm", "k8s", "agents", "scenarios")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _config() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["importlinter"]
    return config


def _contract(contract_id: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [
        c for c in _config()["contracts"] if c.get("id") == contract_id
    ]
    assert len(matches) == 1, f"pyproject.toml needs one import-linter contract id={contract_id!r}"
    return matches[0]


def _lint(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(project)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_import_contracts_are_kept() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("recovery/model/leak.py", "import slurm.cli_slurm", "The core imports no adapter"),
        ("recovery/ports/leak.py", "from recovery import wiring", "The core imports no adapter"),
        ("recovery/coordinator/leak.py", "import sqlite3", "The core imports no adapter"),
        ("recovery/report/leak.py", "import matplotlib", "The core imports no adapter"),
        ("slurm/leak.py", "import recovery.reportgen", "Adapters never import the composition"),
        # NodeControl is the core's port; the adapter and its client stay out of the core.
        ("recovery/coordinator/leak.py", "import k8s.nodes", "The core imports no adapter"),
        ("recovery/ports/leak.py", "import kubernetes", "The core imports no adapter"),
        ("slurm/leak.py", "import recovery.cli", "Adapters never import the composition root"),
        ("agents/leak.py", "import scenarios", "Adapters never import the composition root"),
        ("recovery/train/leak.py", "import scenarios.runner", "The core imports no adapter"),
        ("slurm/leak.py", "import k8s", "independent of each other"),
        ("recovery/cli/leak.py", "import kubernetes", "Only k8s imports kubernetes"),
        ("slurm/leak.py", "import pynvml", "Only agents import pynvml and grpc"),
        # The composition root's own order: the loop service.main -> wiring -> service once
        # hid inside functions; the layers contract sees imports in function bodies too.
        ("recovery/supervise/leak.py", "from recovery import wiring", "Layers: the root in order"),
        ("recovery/httpapi/leak.py", "import recovery.startup.serve", "Layers: the root in order"),
        ("recovery/journaldb/leak.py", "import recovery.httpapi.app", "Layers: the root in order"),
        ("scenarios/leak.py", "import recovery.cli.inject", "Layers: the root in order"),
        ("recovery/startup/leak.py", "def f() -> None:\n    import scenarios", "Layers: the root"),
    ],
)
def test_a_broken_layer_is_caught(tmp_path: Path, module: str, line: str, contract: str) -> None:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / module).write_text(f'"""A forbidden import."""\n\n{line}\n')
    proc = _lint(tmp_path)
    assert proc.returncode != 0, proc.stdout
    broken = [ln for ln in proc.stdout.splitlines() if ln.endswith(" BROKEN")]
    assert any(contract in ln for ln in broken), proc.stdout


def _recovery_modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "recovery").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_recovery_module_is_core_or_composition_root() -> None:
    core = _contract("core")["source_modules"]
    root = _contract("adapters")["forbidden_modules"]
    assert set(root) <= set(_contract("core")["forbidden_modules"])

    def within(module: str, prefixes: list[str]) -> bool:
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    # recovery/__init__.py only holds the version; a package's own __init__ cannot be a
    # contract source without all of recovery, so it must stay import-free.
    init = ast.parse((ROOT / "recovery" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, ast.Import | ast.ImportFrom)]
    modules = [m for m in _recovery_modules() if m != "recovery"]
    assert modules
    unclassified = [m for m in modules if within(m, core) == within(m, root)]
    assert not unclassified, (
        "modules in neither (or both) of the core and the composition root; add each to "
        "[tool.importlinter] in pyproject.toml: " + ", ".join(unclassified)
    )


#: Programs outside slurm/ that run a Slurm command, and why.
SLURM_COMMAND_EXCEPTIONS = {
    # slurmd's Epilog runs on the node, standard library only, without the toolkit installed:
    # it drains its own node with our reason before failing.
    "agents/epilog.py",
}


def test_only_slurm_runs_slurm_commands() -> None:
    commands = {"scontrol", "sbatch", "squeue", "sinfo", "scancel", "slurmctld", "slurmd"}
    offenders = []
    for package in ("recovery", "agents", "k8s", "scenarios"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) in SLURM_COMMAND_EXCEPTIONS:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                # An argv is a list or tuple whose first item names the program.
                if not isinstance(node, ast.List | ast.Tuple) or not node.elts:
                    continue
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in commands:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {first.value!r}")
    assert not offenders, "Slurm commands outside slurm/:\n" + "\n".join(offenders)
