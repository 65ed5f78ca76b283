"""The layering rules, checked on the source.

What may import what is declared once, as import-linter contracts in pyproject.toml
(``[tool.importlinter]``); these tests run that check, prove it catches a broken rule, and make
sure no part of recovery/ or service/ and no top-level package escapes it. The shared cycle
checker (every import counts, wherever it is written) runs where ``../shared`` is beside the
clone. What neither can see (a Slurm argv built outside slurm/) is checked on the AST here.
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
PACKAGES = ("recover", "scenarios", "service", "slurm", "k8s", "agents", "recovery")
LAYERS = "Layers: the command line, scenarios, the service"
SERVICE = "The service's parts in order"
CORE = "The core's folders in order"
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
        # the top-level order: the core imports no adapter and no composition root ...
        ("recovery/model/leak.py", "import slurm.cli_slurm", LAYERS),
        ("recovery/ports/leak.py", "from service import wiring", LAYERS),
        ("recovery/coordinator/leak.py", "import k8s.nodes", LAYERS),
        ("recovery/train/leak.py", "import scenarios.runner", LAYERS),
        # ... an adapter imports no composition root ...
        ("slurm/leak.py", "import service.reportgen", LAYERS),
        ("slurm/leak.py", "import recover", LAYERS),
        ("agents/leak.py", "import scenarios", LAYERS),
        # ... and within the root, the command line is on top
        ("scenarios/leak.py", "import recover.inject", LAYERS),
        ("service/startup/leak.py", "def f() -> None:\n    import scenarios", LAYERS),
        # the core's external clients
        ("recovery/coordinator/leak.py", "import sqlite3", "The core imports no external client"),
        ("recovery/report/leak.py", "import matplotlib", "The core imports no external client"),
        ("recovery/ports/leak.py", "import kubernetes", "The core imports no external client"),
        ("slurm/leak.py", "import k8s", "independent of each other"),
        ("recover/leak.py", "import kubernetes", "Only k8s imports kubernetes"),
        ("slurm/leak.py", "import pynvml", "Only agents import pynvml and grpc"),
        # the service's own order (imports in function bodies count too)
        ("service/daemons/leak.py", "from service import wiring", SERVICE),
        ("service/httpapi/leak.py", "import service.startup.serve", SERVICE),
        ("service/journaldb/leak.py", "import service.httpapi.app", SERVICE),
        # the core's folders: the library never imports the trainer, the contract nothing
        # above it, and the leaves in recovery/ no folder
        ("recovery/api/leak.py", "import recovery.train.loop", CORE),
        ("recovery/contract/leak.py", "from recovery.api import preemption", CORE),
        ("recovery/checkpoint/leak.py", "import recovery.multiproc", CORE),
        ("recovery/statedir.py", "import recovery.ports.slurm", CORE),
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
    broken = [ln for ln in proc.stdout.replace("\n", " ").split(" KEPT") if " BROKEN" in ln]
    assert any(contract in ln for ln in broken), proc.stdout


def _names(layers: list[str]) -> set[str]:
    return {n.strip() for layer in layers for n in layer.replace("|", ":").split(":")}


def _parts(folder: Path) -> set[str]:
    """The modules and packages directly in ``folder`` (its ``__init__`` left out)."""
    out = set()
    for child in folder.iterdir():
        if child.is_dir() and (child / "__init__.py").exists():
            out.add(child.name)
        elif child.suffix == ".py" and child.stem not in ("__init__", "__main__"):
            out.add(child.stem)
    return out


@pytest.mark.parametrize(
    ("package", "contract_id"), [("recovery", "core-order"), ("service", "service-order")]
)
def test_every_part_of_the_core_and_the_service_is_in_a_layer(
    package: str, contract_id: str
) -> None:
    named = _names(_contract(contract_id)["layers"])
    missing = sorted(_parts(ROOT / package) - named)
    assert not missing, (
        f"parts of {package}/ in no layer of the {contract_id!r} contract in pyproject.toml "
        f"(add each where it belongs): {', '.join(missing)}"
    )


def test_every_top_level_package_is_a_layer() -> None:
    named = _names(_contract("layers")["layers"])
    assert named == set(PACKAGES)
    assert set(_config()["root_packages"]) == set(PACKAGES)


def test_the_core_package_itself_imports_nothing() -> None:
    # recovery/__init__.py only holds the version: importing any part of the core must not
    # load the rest (the coordinator's install has no JAX, the trainer's no FastAPI).
    init = ast.parse((ROOT / "recovery" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, ast.Import | ast.ImportFrom)]


#: The shared checker of folder and file cycles (every import counts, wherever it is written,
#: which import-linter's contracts do not cover inside an adapter's own folders).
CYCLES_TOOL = ROOT.parent / "shared" / "tools" / "import_cycles.py"


@pytest.mark.skipif(not CYCLES_TOOL.exists(), reason=f"no {CYCLES_TOOL} beside this clone")
def test_no_folder_or_file_import_cycles() -> None:
    proc = subprocess.run(
        [sys.executable, str(CYCLES_TOOL), str(ROOT)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.stdout.startswith("0 folder cycle(s), 0 file cycle(s)"), proc.stdout


#: Programs outside slurm/ that run a Slurm command, and why.
SLURM_COMMAND_EXCEPTIONS = {
    # slurmd's Epilog runs on the node, standard library only, without the toolkit installed:
    # it drains its own node with our reason before failing.
    "agents/epilog.py",
}


@pytest.mark.slow
def test_only_slurm_runs_slurm_commands() -> None:
    commands = {"scontrol", "sbatch", "squeue", "sinfo", "scancel", "slurmctld", "slurmd"}
    offenders = []
    for package in ("recover", "service", "recovery", "agents", "k8s", "scenarios"):
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
