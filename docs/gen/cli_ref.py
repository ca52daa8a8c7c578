"""The CLI reference page (``docs/reference/cli.md``), rendered from the code; ``python docs/gen/regenerate.py`` (from
the repository root) writes it with the other generated pages.

The ``r1`` command is read from its typer app (``typer.main.get_command(flows.cli.app)``): every command and
sub-command, its usage line, help, arguments and options with their flags, type, default and help. Types come from
the Python signature of the command's function (its annotation and the option's ``min``/``max``), the rest from the
command objects, so the page is the same whatever the terminal width, the machine or the typer release. The other
entry points (modules and scripts with a ``__main__`` block, as ``tests/test_entry_points.py`` finds them) follow:
an argparse parser is built from its function's source without running the module (no torch import), a module
without one is shown by the usage line of its docstring. ``tests/docs/test_cli_reference.py`` keeps the page equal
to this rendering.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGE = "reference/cli.md"
# Folders whose modules users run (tests/test_entry_points.py also checks tests/benchmarks: see the Benchmarks page)
ENTRY_FOLDERS = ("grpo_core", "tasks", "flows", "infra")
R1_MODULE = "flows/cli.py"
INTERNAL = {"tasks/runner/worker.py": "the training child; the training tasks start it (tasks/runner/launch.py), "
                                      "not a user"}


# ---------------------------------------------------------------------------------------------- markdown helpers
def cell(text: Any) -> str:
    """``text`` as one table cell: one line, ``|`` and ``<`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;")


def paragraphs(text: str) -> str:
    """A help text as Markdown paragraphs (its blank lines kept, ``<`` escaped)."""
    blocks = [" ".join(b.split()) for b in inspect.cleandoc(text).split("\n\n") if b.strip()]
    return "\n\n".join(b.replace("``", "`").replace("<", "&lt;") for b in blocks)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


# ---------------------------------------------------------------------------------------------- the typer app
def _unoptional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def type_name(annotation: Any) -> str:
    """A Python annotation in words: ``Optional[int]`` -> ``integer``, ``list[str]`` -> ``text, repeatable``."""
    annotation = _unoptional(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is list:
        return f"{type_name(typing.get_args(annotation)[0])}, repeatable"
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(annotation)))
    names = {str: "text", int: "integer", float: "number", bool: "flag", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _signature(cmd: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(annotations, typer parameter infos) of the command's function, by parameter name."""
    fn = inspect.unwrap(cmd.callback) if cmd.callback is not None else None
    if fn is None:
        return {}, {}
    hints = typing.get_type_hints(fn, include_extras=True)
    infos: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        meta = typing.get_args(hints.get(name)) if typing.get_origin(hints.get(name)) is typing.Annotated else ()
        infos[name] = next((m for m in meta[1:] if hasattr(m, "param_decls")), p.default)
    return hints, infos


def param_type(param: Any, hints: dict[str, Any], infos: dict[str, Any]) -> str:
    name = type_name(hints[param.name]) if param.name in hints else "text"
    if getattr(param, "secondary_opts", None):
        return "flag pair"
    info = infos.get(param.name)
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    bounds = [b for b in (f">= {low:g}" if low is not None else "", f"<= {high:g}" if high is not None else "") if b]
    return f"{name} {' and '.join(bounds)}" if bounds else name


def param_default(param: Any) -> str:
    if param.required:
        return "(required)"
    default = param.default
    if callable(default):
        return "(computed)"
    if getattr(param, "secondary_opts", None):
        opts = {True: param.opts[-1], False: param.secondary_opts[-1]}
        return f"`{opts[default]}`" if default in opts else "unset"
    if default is None or default == [] or default == ():
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def flags(param: Any) -> str:
    """``-c``, ``--config``; ``--vllm`` / ``--no-vllm`` for a flag pair."""
    out = ", ".join(f"`{o}`" for o in param.opts)
    if getattr(param, "secondary_opts", None):
        out += " / " + ", ".join(f"`{o}`" for o in param.secondary_opts)
    return out


def is_argument(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "argument"


def arg_metavar(param: Any) -> str:
    name = getattr(param, "metavar", None) or param.name.upper()
    name = name + "..." if param.nargs == -1 else name
    return name if param.required else f"[{name}]"


def all_options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if not is_argument(p)]


def is_group(cmd: Any) -> bool:
    return hasattr(cmd, "list_commands")


def usage(cmd: Any, path: str) -> str:
    pieces = [path]
    if all_options(cmd) or is_group(cmd):
        pieces.append("[OPTIONS]")
    pieces += [arg_metavar(p) for p in cmd.params if is_argument(p)]
    if is_group(cmd):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def subcommands(cmd: Any, path: str) -> list[tuple[str, Any]]:
    """``(name, command)`` of each sub-command of group ``cmd``, in its listing order; hidden ones left out."""
    ctx = cmd.context_class(cmd, info_name=path.split()[-1])
    out = []
    for name in cmd.list_commands(ctx):
        sub = cmd.get_command(ctx, name)
        if sub is not None and not getattr(sub, "hidden", False):
            out.append((name, sub))
    return out


def command_section(cmd: Any, path: str, level: int) -> list[str]:
    """The section of one command and, recursively, of its sub-commands."""
    hints, infos = _signature(cmd)
    lines = [f"{'#' * level} {path}", "", "```text", usage(cmd, path), "```", ""]
    if cmd.help:
        lines += [paragraphs(cmd.help), ""]
    args = [p for p in cmd.params if is_argument(p)]
    if args:
        rows = [[f"`{arg_metavar(p).strip('[]')}`", cell(param_type(p, hints, infos)),
                 "yes" if p.required else "no", param_default(p) if not p.required else "",
                 cell(getattr(p, "help", None) or "")] for p in args]
        lines += table(["Argument", "Type", "Required", "Default", "Help"], rows) + [""]
    options = all_options(cmd)
    if options:
        rows = [[flags(p), cell(param_type(p, hints, infos)), "yes" if p.required else "no",
                 param_default(p) if not p.required else "",
                 cell(("hidden from `--help`: " if getattr(p, "hidden", False) else "") + (p.help or ""))]
                for p in options]
        lines += table(["Option", "Type", "Required", "Default", "Help"], rows) + [""]
    if is_group(cmd):
        subs = subcommands(cmd, path)
        lines += table(["Command", "What it does"],
                       [[f"[`{path} {name}`](#{(path + ' ' + name).replace(' ', '-')})",
                         cell(inspect.cleandoc(sub.help or "").split("\n\n")[0])] for name, sub in subs]) + [""]
        for name, sub in subs:
            lines += command_section(sub, f"{path} {name}", level + 1)
    return lines


def r1_command() -> Any:
    import typer

    from flows.cli import app

    return typer.main.get_command(app)


def walk(cmd: Any, path: str = "r1") -> list[tuple[str, Any]]:
    """``(command path, command)`` of ``cmd`` and every sub-command under it, depth first."""
    out = [(path, cmd)]
    if is_group(cmd):
        for name, sub in subcommands(cmd, path):
            out += walk(sub, f"{path} {name}")
    return out


# ---------------------------------------------------------------------------------------------- other entry points
def has_main_block(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.Name)
               and n.test.left.id == "__name__" for n in tree.body)


def entry_points() -> list[Path]:
    """The modules and scripts with a ``__main__`` block, as ``tests/test_entry_points.py`` finds them (its
    ``tests/benchmarks`` scripts excepted), sorted by path."""
    return sorted(p.relative_to(ROOT) for folder in ENTRY_FOLDERS for p in (ROOT / folder).rglob("*.py")
                  if has_main_block(ast.parse(p.read_text())))


def run_command(rel: Path) -> str:
    if rel.parts[0] in ("grpo_core", "tasks", "flows"):
        return "python -m " + ".".join(rel.with_suffix("").parts)
    return f"python {rel.as_posix()}"


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser built")
        self.parser = parser


class _CapturingParser(argparse.ArgumentParser):
    def parse_args(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise _Built(self)


def argparse_parser(rel: Path, tree: ast.Module) -> argparse.ArgumentParser | None:
    """The parser a module's function builds (the function that calls ``argparse.ArgumentParser``), built from that
    function's source alone, with the module's docstring as ``__doc__``: nothing else of the module runs (its heavy
    imports neither). None when the module has no such function."""
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == "argparse.ArgumentParser"]
        if not calls:
            continue
        fake = types.SimpleNamespace(**{k: getattr(argparse, k) for k in dir(argparse) if not k.startswith("_")})
        fake.ArgumentParser = _CapturingParser
        namespace: dict[str, Any] = {"argparse": fake, "__doc__": ast.get_docstring(tree, clean=False) or "",
                                     "__name__": "docs_gen_entry"}
        exec(compile(ast.Module(body=[fn], type_ignores=[]), str(rel), "exec"), namespace)  # noqa: S102
        try:
            namespace[fn.name]([])
        except _Built as built:
            built.parser.prog = run_command(rel)
            return built.parser
    return None


def argparse_section(parser: argparse.ArgumentParser, shown: str = "") -> list[str]:
    """Usage, description (unless it is ``shown`` already) and every argument of an argparse parser, without its
    width-dependent help format."""
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    pieces = [parser.prog]
    for a in actions:
        if a.option_strings:
            metavar = "" if a.nargs == 0 else " " + (a.metavar or a.dest.upper())
            piece = f"{a.option_strings[-1]}{metavar}"
            pieces.append(piece if a.required else f"[{piece}]")
        else:
            pieces.append(a.metavar or a.dest)
    lines = ["```text", " ".join(pieces), "```", ""]
    if parser.description and paragraphs(parser.description) != shown:
        lines += [paragraphs(parser.description), ""]
    rows = []
    for a in actions:
        kind = {int: "integer", float: "number", None: "text", str: "text"}.get(a.type, getattr(a.type, "__name__", ""))
        if a.nargs == 0:
            kind = "flag"
        default = "" if a.required else ("unset" if a.default is None else f"`{a.default}`")
        rows.append([", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest}`", kind,
                     "yes" if a.required else "no", default, cell(a.help or "")])
    return lines + table(["Option", "Type", "Required", "Default", "Help"], rows) + [""]


def docstring_usage(tree: ast.Module, command: str) -> str | None:
    """The docstring's usage line for ``command`` (with the lines it continues, ``\\`` at their end)."""
    lines = (ast.get_docstring(tree) or "").splitlines()
    for i, line in enumerate(lines):
        if command in line:
            start = i
            while start > 0 and lines[start - 1].rstrip().endswith("\\"):
                start -= 1
            return "\n".join(" ".join(ln.split()) for ln in lines[start:i + 1])
    return None


def summary(tree: ast.Module) -> str:
    """The docstring's first sentence, one line."""
    return paragraphs((ast.get_docstring(tree) or "").split("\n\n")[0])


def short_road_fields() -> list[str]:
    """The fields of ``python -m grpo_core.train``'s YAML file (``grpo_core.train.TrainFile``)."""
    from pydantic_core import PydanticUndefined

    from grpo_core.train import TrainFile

    rows = []
    for name, field in TrainFile.model_fields.items():
        required = field.is_required()
        if required:
            default = ""
        elif field.default_factory is not None:
            made = field.default_factory()
            default = "`{}`" if made == {} else f"{type(made).__name__}'s defaults"
        else:
            value = str(field.default).lower() if isinstance(field.default, bool) else field.default
            default = f"`{value}`" if field.default is not PydanticUndefined else ""
        rows.append([f"`{name}`", cell(type_name(field.annotation)), "yes" if required else "no", default,
                     cell(field.description or "")])
    return table(["Field", "Type", "Required", "Default", "What it is"], rows)


def other_entry_points() -> list[str]:
    lines = ["## Other entry points", "",
             "Modules and scripts with a `__main__` block (each answers `--help`: "
             "[tests/test_entry_points.py](/tests/test_entry_points.py)). The benchmark scripts under "
             "`tests/benchmarks/` are on the [Benchmarks](../benchmarks.md) page.", ""]
    for rel in entry_points():
        if rel.as_posix() == R1_MODULE:
            continue
        tree = ast.parse((ROOT / rel).read_text())
        command = run_command(rel)
        lines += [f"### {command}", "", f"[{rel.as_posix()}](/{rel.as_posix()}): {summary(tree)}", ""]
        if rel.as_posix() in INTERNAL:
            lines += [f"Internal: {INTERNAL[rel.as_posix()]}.", ""]
        parser = argparse_parser(rel, tree)
        if parser is not None:
            lines += argparse_section(parser, summary(tree))
            continue
        shown = docstring_usage(tree, command)
        if shown:
            lines += ["```text", shown, "```", ""]
        if rel.as_posix() == "grpo_core/train.py":
            lines += ["The YAML file's fields (`grpo_core.train.TrainFile`; a problem fails with exit code 2 before "
                      "any model loads, naming the file and the field):", ""] + short_road_fields() + [""]
    return lines


# ---------------------------------------------------------------------------------------------- the page
def render() -> dict[str, str]:
    root = r1_command()
    commands = walk(root)
    n_options = sum(len(all_options(c)) for _, c in commands)
    lines = ["# CLI", "",
             "!!! note \"Generated page\"",
             "    Generated from the code by `python docs/gen/regenerate.py`; do not edit it by hand. "
             "[tests/docs/test_cli_reference.py](/tests/docs/test_cli_reference.py) fails when it is out of date.",
             "",
             f"The `r1` command ([flows/cli.py](/flows/cli.py)) has {len(commands) - 1} commands and "
             f"{n_options} options in all. Every command also takes `--help`. A failed command prints one `error:` "
             "line and exits with code 1; Ctrl-C exits with code 130 ([Troubleshooting](../troubleshooting.md)).",
             ""]
    lines += command_section(root, "r1", 2)
    lines += other_entry_points()
    return {PAGE: "\n".join(lines).rstrip() + "\n"}
