"""Imports point down only: flows -> tasks -> grpo_core, and inside grpo_core and tasks from floor to floor (each
package's docstring names its floors). Every module's imports are walked (AST, also inside functions, which
importing a module does not execute); an import inside a function says why it is there (an optional dependency, a
heavy import, a process start), never to step around a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("grpo_core", "tasks", "flows")  # each may import only the ones before it (and itself)
# Inside a layer, bottom up: a sub-package (or top-level module) imports only itself and the floors below its own;
# two on one floor do not import each other. A new sub-package is placed here, or the test fails.
FLOORS: dict[str, tuple[tuple[str, ...], ...]] = {
    "grpo_core": (("config", "seeds", "models"), ("rewards",), ("tools",), ("data", "generation"),
                  ("evaluation", "plan"), ("trainer",), ("recipe",), ("train",)),
    "tasks": (("storage",), ("config",), ("runner",), ("stages",), ("check",)),
}
# Why an import may sit inside a function: a comment on its line, or on the line above its block of imports.
INNER_IMPORT_REASONS = ("optional dependency", "heavy import", "process start")


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def project_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, dotted module, inside a function) of every absolute import of a project module in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        out += [(node.lineno, name, id(node) in inner) for name in names if name.split(".")[0] in LAYERS]
    return out


def floor_of(layer: str, module: str) -> tuple[int, str] | None:
    """(floor, sub-package or top module) of dotted ``module`` inside ``layer``; None for the layer's own face."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for n, floor in enumerate(FLOORS[layer]):
        if parts[1] in floor:
            return n, parts[1]
    return -1, parts[1]


def floor_problems(root: Path, layer: str) -> list[str]:
    """Every import inside ``layer`` that points at a floor above its own or across its floor, and every module of a
    sub-package the floors do not name."""
    problems = []
    for path in sorted((root / layer).rglob("*.py")):
        rel = path.relative_to(root)
        here = floor_of(layer, ".".join(p for p in rel.with_suffix("").parts if p != "__init__"))
        if here is None:
            continue
        if here[0] < 0:
            problems.append(f"{rel}: {layer}.{here[1]} is on no floor of {layer} (tests/test_layers.py FLOORS)")
            continue
        for line, module, _ in project_imports(path):
            there = floor_of(layer, module) if module.split(".")[0] == layer else None
            if there is None or there[1] == here[1] or there[0] < here[0]:
                continue
            problems.append(f"{rel}:{line} imports {module}: {layer}.{here[1]} (floor {here[0]}) may not import "
                            f"{layer}.{there[1]} (floor {there[0]})")
    return problems


@pytest.mark.parametrize("layer", sorted(FLOORS))
def test_no_module_imports_a_floor_above_its_own_or_beside_it(layer):
    assert floor_problems(ROOT, layer) == []


@pytest.mark.parametrize("layer", sorted(FLOORS))
def test_the_package_docstring_names_the_floors_in_order(layer):
    doc = ast.get_docstring(ast.parse((ROOT / layer / "__init__.py").read_text())) or ""
    positions = [[m.start() for m in re.finditer(rf"``{name}``", doc)] for floor in FLOORS[layer] for name in floor]
    assert all(positions), f"{layer}/__init__.py's docstring names every floor's package as ``name``"
    firsts = [p[0] for p in positions]
    assert firsts == sorted(firsts), f"{layer}/__init__.py's docstring names the floors bottom up, as FLOORS has them"


def test_a_planted_upward_or_sideways_import_is_caught(tmp_path):
    for name, text in {"config.py": "", "data/__init__.py": "", "data/rows.py": "from grpo_core.trainer.loop import x\n",
                       "generation/hf.py": "def f():\n    from grpo_core.data import rows\n",
                       "trainer/loop.py": "from grpo_core.data.rows import y\n", "extra/m.py": ""}.items():
        (tmp_path / "grpo_core" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "grpo_core" / name).write_text(text)
    assert floor_problems(tmp_path, "grpo_core") == [
        "grpo_core/data/rows.py:1 imports grpo_core.trainer.loop: grpo_core.data (floor 3) may not import "
        "grpo_core.trainer (floor 5)",
        "grpo_core/extra/m.py: grpo_core.extra is on no floor of grpo_core (tests/test_layers.py FLOORS)",
        "grpo_core/generation/hf.py:2 imports grpo_core.data: grpo_core.generation (floor 3) may not import "
        "grpo_core.data (floor 3)"]


def test_no_stage_body_imports_another():
    """tasks/stages holds one module per body, none importing another: a body two entries share is one module
    (tasks/stages/rl.py), and what bodies share sits in tasks/runner."""
    for path in sorted((ROOT / "tasks" / "stages").glob("*.py")):
        others = [f"{line}: {module}" for line, module, _ in project_imports(path) if module.startswith("tasks.stages")]
        assert not others, f"tasks/stages/{path.name} imports another stage module: {others}"


def inner_imports_without_reason(root: Path) -> list[str]:
    """Every import of a project module inside a function whose line, or the comment line above its block of
    imports, does not say which of ``INNER_IMPORT_REASONS`` puts it there."""
    problems = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            lines = path.read_text().splitlines()
            for line, module, inner in project_imports(path):
                if not inner:
                    continue
                above = line - 1
                while above > 0 and re.match(r"\s*(from|import)\s", lines[above - 1]):
                    above -= 1  # up the block of imports this one stands in
                said = lines[line - 1] + " " + (lines[above - 1] if above > 0 else "")
                if not any(f"# {reason}" in said or f"#{reason}" in said for reason in INNER_IMPORT_REASONS):
                    problems.append(f"{path.relative_to(root)}:{line} imports {module} inside a function without "
                                    f"saying why ({' / '.join(INNER_IMPORT_REASONS)})")
    return problems


def test_an_import_inside_a_function_says_why():
    assert inner_imports_without_reason(ROOT) == []


def test_an_inner_import_without_a_reason_is_caught(tmp_path):
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / "tasks" / "m.py").write_text(
        "def f():\n    # heavy import (torch)\n    from grpo_core.a import x\n    from grpo_core.b import y\n\n"
        "def g():\n    import json\n    from grpo_core.c import z  # to dodge a circle\n\n"
        "def h():\n    from grpo_core.d import w  # optional dependency (vllm)\n")
    assert inner_imports_without_reason(tmp_path) == [
        "tasks/m.py:8 imports grpo_core.c inside a function without saying why (optional dependency / heavy import / "
        "process start)"]


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


@pytest.mark.parametrize("layer, statement", [("grpo_core", "from tasks.storage.store import Store"),
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
    points at ``pkg.name`` when that is a module, else at ``pkg``; relative imports are resolved. As Python runs
    them, importing ``a.b.c`` also runs the packages ``a`` and ``a.b`` (their ``__init__``), which the importer
    has not run already (its own packages have)."""
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
        own = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        found = {m for t in targets if (m := owner(t)) is not None}
        runs = found | {p for m in found for i in range(1, len(m.split("."))) if (p := ".".join(m.split(".")[:i]))
                        in modules}
        graph[name] = runs - own - {name}
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
    assert "grpo_core.trainer.loop" in graph["grpo_core.trainer.step"] or "grpo_core.trainer.step" in graph[
        "grpo_core.trainer.loop"]  # the graph sees the modules
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


def test_a_circle_through_a_package_init_is_caught(tmp_path):
    """``p/__init__.py`` imports ``p.loop``, which imports ``q.m``, which imports ``p.loss``: importing ``p.loss`` runs
    ``p/__init__`` first, so the three modules and the package form one circle (what Python runs, not only the
    names written)."""
    for name in LAYERS:
        (tmp_path / name).mkdir()
    files = {"p/__init__.py": "from grpo_core.p.loop import train\n", "p/loop.py": "from grpo_core.q.m import f\n",
             "p/loss.py": "", "q/__init__.py": "", "q/m.py": "def f():\n    from grpo_core.p.loss import g\n"}
    for name, text in files.items():
        (tmp_path / "grpo_core" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "grpo_core" / name).write_text(text)
    assert import_circles(import_graph(tmp_path)) == [["grpo_core.p", "grpo_core.p.loop", "grpo_core.q.m"]]
    (tmp_path / "grpo_core" / "p" / "__init__.py").write_text("")  # a package face without side imports: no circle
    assert import_circles(import_graph(tmp_path)) == []


MAX_MODULE_LINES = 600  # a module one reads in one sitting; a longer one is a package of concerns


def long_modules(root: Path) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for folder in (*LAYERS, "infra") for p in sorted((root / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]


def test_no_module_is_over_600_lines():
    assert long_modules(ROOT) == []


def test_a_long_module_is_caught(tmp_path):
    (tmp_path / "tasks").mkdir(parents=True)
    (tmp_path / "tasks" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(tmp_path) == [f"tasks/big.py: {MAX_MODULE_LINES + 1} lines"]
