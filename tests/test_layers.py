"""Imports point down only: flows -> tasks -> grpo_core. Every module's imports are walked (AST, also
inside functions, which importing a module does not execute)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("grpo_core", "tasks", "flows")  # each may import only the ones before it (and itself)


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def upward_imports(root: Path) -> list[str]:
    problems = []
    for rank, layer in enumerate(LAYERS):
        above = set(LAYERS[rank + 1:])
        for path in sorted((root / layer).rglob("*.py")):
            for line, package in imported_packages(path):
                if package in above:
                    problems.append(f"{path.relative_to(root)}:{line} imports {package} (a layer above {layer})")
    return problems


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(ROOT) == []


@pytest.mark.parametrize("layer, statement", [("grpo_core", "from tasks.store import Store"),
                                              ("tasks", "import flows.report"),
                                              ("grpo_core", "from flows.cli import app")])
def test_an_upward_import_inside_a_function_is_caught(tmp_path, layer, statement):
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / layer / "m.py").write_text(f"def f():\n    {statement}\n")
    assert upward_imports(tmp_path) == [f"{layer}/m.py:2 imports {statement.split()[1].split('.')[0]} "
                                        f"(a layer above {layer})"]
