"""The layering rules of STYLE.md, checked on the source: each external system is reached
only through its own package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level modules it must never import
FORBIDDEN: dict[str, set[str]] = {
    "recovery": {"kubernetes", "pynvml", "slurm", "k8s", "agents"},
    "slurm": {"kubernetes", "pynvml", "k8s", "agents"},
    "agents": {"kubernetes", "slurm", "k8s"},
    "k8s": {"pynvml", "slurm", "agents"},
}
# The CLI composes the parts: it may import the adapters (lazily, inside commands).
ALLOWED = {("recovery/cli/cluster.py", "slurm")}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_only_reach_their_own_external_systems(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources found under {package}/"
    broken = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for name in sorted(_imports(path) & FORBIDDEN[package]):
            if (rel, name) not in ALLOWED:
                broken.append(f"{rel} imports {name}")
    assert not broken, "layering broken:\n" + "\n".join(broken)


def test_only_slurm_runs_slurm_commands() -> None:
    commands = {"scontrol", "sbatch", "squeue", "sinfo", "scancel", "slurmctld", "slurmd"}
    offenders = []
    for package in ("recovery", "agents", "k8s", "scenarios"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                # An argv is a list or tuple whose first item names the program.
                if not isinstance(node, ast.List | ast.Tuple) or not node.elts:
                    continue
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in commands:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {first.value!r}")
    assert not offenders, "Slurm commands outside slurm/:\n" + "\n".join(offenders)
