"""The top-level package (gpunode/) is pure logic: at run time it imports neither pyinfra nor the facts,
operations or pipelines built on it (imports for type checking only are allowed)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS_ABOVE = ("pyinfra_gpunode.facts", "pyinfra_gpunode.operations", "pyinfra_gpunode.pipelines")


def _runtime_imports(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []  # type-only imports do not run
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _offending(name: str) -> bool:
    return name == "pyinfra" or name.startswith(("pyinfra.", "pyinfra_cli")) or name.startswith(LAYERS_ABOVE)


def test_the_pure_package_imports_no_pyinfra_and_no_layer_above() -> None:
    found = {
        path.name: bad
        for path in sorted((REPO / "gpunode").glob("*.py"))
        if (bad := [name for name in _runtime_imports(ast.parse(path.read_text())) if _offending(name)])
    }
    assert not found, f"gpunode/ modules importing pyinfra or the layers above at run time: {found}"


def test_the_check_sees_an_offending_import() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from pyinfra.api import FactBase\n"
        "if TYPE_CHECKING:\n"
        "    import pyinfra_gpunode.facts.cdi\n"
    )
    assert [name for name in _runtime_imports(tree) if _offending(name)] == ["pyinfra.api"]
