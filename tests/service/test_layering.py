"""The service is an adapter: nothing in the core imports it (only the CLI, which composes)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_core_never_imports_the_service() -> None:
    offenders = []
    for path in sorted((ROOT / "recovery").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("recovery/service/", "recovery/cli/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{rel}: {n}" for n in names if n.startswith("recovery.service")]
    assert offenders == []
