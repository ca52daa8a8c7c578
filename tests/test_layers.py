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


# ------------------------------------------------------------------ no import circle inside or across packages

def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under the layers; a package's ``__init__`` is the package's name."""
    out = {}
    for layer in LAYERS:
        for path in (root / layer).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (every import, nested ones included). ``from pkg import name``
    points at ``pkg.name`` when that is a module, else at ``pkg``; relative imports are resolved."""
    modules = module_names(root)

    def owner(name: str) -> str | None:  # the longest project module that ``name`` is or lies in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets += [base] + [f"{base}.{alias.name}" for alias in node.names]
        graph[name] = {m for t in targets if (m := owner(t)) is not None and m != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def describe_circle(graph: dict[str, set[str]], component: list[str]) -> str:
    """One cycle through the component's first module, as ``a -> b -> a``, and the component's size."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first inside the component, back to the start
        node = frontier.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return f"{' -> '.join(paths[node] + [start])} ({len(component)} modules: {', '.join(component)})"
            if child not in paths:
                paths[child] = paths[node] + [child]
                frontier.append(child)
    return ", ".join(component)


def test_no_import_circle():
    graph = import_graph(ROOT)
    assert "tasks.stages" in graph and "tasks.config" in graph["tasks.plan"]  # the graph sees the modules
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(describe_circle(graph, c) for c in circles)


def test_a_planted_circle_is_caught_even_inside_functions_and_from_imports(tmp_path):
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / "tasks" / "__init__.py").write_text("")
    (tmp_path / "tasks" / "a.py").write_text("from tasks import b\n")
    (tmp_path / "tasks" / "b.py").write_text("def f():\n    from .a import g\n")
    (tmp_path / "tasks" / "c.py").write_text("from tasks.a import h\n")  # reads the circle, is not in it
    graph = import_graph(tmp_path)
    assert import_circles(graph) == [["tasks.a", "tasks.b"]]
    assert describe_circle(graph, ["tasks.a", "tasks.b"]).startswith("tasks.a -> tasks.b -> tasks.a")
