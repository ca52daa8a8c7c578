"""docs/troubleshooting.md has an entry for every exception class the pipeline defines, and what each entry quotes
is what the code says.

The classes are found by an AST walk of ``grpo_core/``, ``tasks/`` and ``flows/`` (no hand list): a class whose base
is a built-in exception, another such class of the project, or a name ending in ``Error``/``Exception``. Each needs a
heading with its name (or a place in ``SKIPPED``, with the reason) and, under it, a link to the file that defines it
and at least one **Message** line. The marker for a quoted message: a line starting ``**Message**:``, whose first code
span is a fragment of the message, with ``{...}`` where the code fills something in. It must occur in one of the
string literals (f-strings with each ``{...}`` field written ``{...}``, ``%s``-style fields too) of the module that
defines the class, of a module that raises or names it, or of a module the entry links to: a reworded message fails
here until the page follows it.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
PACKAGES = ("grpo_core", "tasks", "flows")

# Exception classes with no entry, and why: private ones, and internal control flow that never reaches a user.
SKIPPED = {
    "_SoftTimeout": "private (grpo_core/rewards/pool.py): a reward worker's own alarm, caught there and scored as a "
                    "timeout",
    "Stalled": "internal control flow (tasks/storage/deadline.py): Store._bounded always turns it into StoreStalled, "
               "which has its entry",
    "RequestFailed": "internal (grpo_core/rewards/served.py): one row's failed request, returned as a value and "
                     "counted in rewards/NAME/errors; RewardServerUnavailable, which has its entry, is what stops a run",
}
BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
HEADING = re.compile(r"^(#{1,6}) +(.+?) *$", re.M)
MESSAGE = re.compile(r"^\*\*Message\*\*: *(`+)(.+?)\1", re.M)
LINK = re.compile(r"\]\(/((?:grpo_core|tasks|flows|tests)/[^)#\s]+)\)")
PERCENT_FIELD = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgixe]")


@dataclass(frozen=True)
class ErrorClass:
    name: str
    path: str  # repository-relative file that defines it
    bases: tuple[str, ...]


def modules() -> dict[str, ast.Module]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text())
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def exception_classes(trees: dict[str, ast.Module]) -> dict[str, ErrorClass]:
    """Every class under grpo_core/, tasks/ and flows/ that derives from an exception, by name."""
    classes = {node.name: ErrorClass(node.name, path, tuple(ast.unparse(b).split(".")[-1] for b in node.bases))
               for path, tree in trees.items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

    def is_exception(name: str, seen: frozenset = frozenset()) -> bool:
        if name in BUILTIN_EXCEPTIONS:
            return True
        if name in classes and name not in seen:
            return any(is_exception(b, seen | {name}) for b in classes[name].bases)
        return name not in classes and name.endswith(("Error", "Exception"))  # a library's exception

    return {name: c for name, c in classes.items() if any(is_exception(b, frozenset({name})) for b in c.bases)}


def templates(tree: ast.Module) -> list[str]:
    """Every string literal of a module, f-string fields and %-fields written ``{...}``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(PERCENT_FIELD.sub("{...}", node.value))
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values))
    return out


def names_used(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
           {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def entries(page: str) -> dict[str, str]:
    """Heading text -> the text under it, up to the next heading."""
    heads = list(HEADING.finditer(page))
    return {m.group(2): page[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(page)]
            for i, m in enumerate(heads)}


def quoted(entry: str) -> list[str]:
    return [m.group(2).strip() for m in MESSAGE.finditer(entry)]


def test_the_walk_finds_the_pipelines_errors():
    found = exception_classes(modules())
    assert {"ConfigError", "DataError", "StoreError", "LeaseHeld", "LeaseLost", "StageMemoryError", "SamplerCrashed",
            "VLLMServerError", "IntegrityError", "StageFailed"} <= set(found)
    assert found["LeaseHeld"].path == "tasks/storage/lease.py"
    assert len(found) >= 30, sorted(found)


def test_every_error_class_has_an_entry_or_a_reason_to_skip_it():
    found = exception_classes(modules())
    documented = entries(PAGE.read_text())
    stale = sorted(set(SKIPPED) - set(found))
    assert not stale, f"SKIPPED names classes the code no longer defines: {stale}"
    private = sorted(n for n in found if n.startswith("_") and n not in SKIPPED)
    assert not private, f"private exception classes: add them to SKIPPED with the reason: {private}"
    missing = sorted(n for n in found if n not in documented and n not in SKIPPED)
    assert not missing, (f"exception classes without a heading in docs/troubleshooting.md: {missing}; add an entry "
                         "(where it is defined, when, the message, the fix) or add them to SKIPPED with the reason")


def test_each_entry_links_its_module_and_quotes_its_message():
    trees = modules()
    found = exception_classes(trees)
    documented = entries(PAGE.read_text())
    used = {path: names_used(tree) for path, tree in trees.items()}
    strings = {path: templates(tree) for path, tree in trees.items()}
    problems = []
    for name, cls in sorted(found.items()):
        if name in SKIPPED:
            continue
        text = documented.get(name, "")
        if f"](/{cls.path})" not in text:
            problems.append(f"{name}: no link to where it is defined, [{cls.path}](/{cls.path})")
        for marker in ("**When**", "**Fix**"):
            if marker not in text:
                problems.append(f"{name}: no {marker}")
        fragments = quoted(text)
        if not fragments:
            problems.append(f"{name}: no **Message**: line quoting the message")
        # where the message may be written: the defining module, modules that raise or name it, modules linked
        where = {cls.path} | {path for path, names in used.items() if name in names} | \
                {p for p in LINK.findall(text) if p in trees}
        literals = [t for path in sorted(where) for t in strings[path]]
        for fragment in fragments:
            if not any(fragment in t for t in literals):
                problems.append(f"{name}: the quoted message {fragment!r} is in none of {sorted(where)}")
    assert not problems, "docs/troubleshooting.md:\n" + "\n".join(problems)


def test_a_new_error_class_is_noticed():
    trees = modules()
    trees["tasks/new_module.py"] = ast.parse("class BrandNewError(ValueError):\n    pass\n\n"
                                             "class EvenNewer(BrandNewError):\n    pass\n")
    found = exception_classes(trees)
    assert {"BrandNewError", "EvenNewer"} <= set(found)
    assert "BrandNewError" not in entries(PAGE.read_text())


def test_a_reworded_message_is_noticed():
    tree = ast.parse('raise LeaseHeld(f"run {run!r} is taken by {who}; wait for it")')
    literals = templates(tree)
    assert any("run {...} is taken by {...}; wait for it" in t for t in literals)
    held = quoted(entries(PAGE.read_text())["LeaseHeld"])
    assert held and not any(f in t for f in held for t in literals)


def test_the_faults_table_cites_tests_that_exist():
    page = PAGE.read_text()
    table = page.split("## Faults, what happens and what to do", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| fault")]
    assert len(rows) >= 20, "the faults table lost rows"
    cited = 0
    for row in rows:
        cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        for path, test in re.findall(r"\[(tests/[^\]]+\.py)\]\(/\1\)(?:::`(test_\w+)`)?", cell):
            source = ROOT / path
            assert source.is_file(), f"faults table: {path} does not exist"
            if test:
                assert re.search(rf"^\s*(?:async )?def {test}\b", source.read_text(), re.M), \
                    f"faults table: {path} has no test {test}"
            cited += 1
        assert re.search(r"\]\(/tests/", cell), f"faults table row cites no test: {row[:80]}"
    assert cited >= 30
