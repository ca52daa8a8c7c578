"""The CLI reference page (docs/reference/cli.md) is what ``docs/gen/cli_ref.py`` renders from the typer app, and it
covers every command, argument and option of ``r1`` and every entry point users run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"
REGENERATE = "run `python docs/gen/regenerate.py` and commit docs/reference/cli.md"


def load_cli_ref():
    spec = importlib.util.spec_from_file_location("docs_gen_cli_ref", ROOT / "docs" / "gen" / "cli_ref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cli_ref():
    return load_cli_ref()


@pytest.fixture(scope="module")
def rendered(cli_ref) -> str:
    return cli_ref.render()["reference/cli.md"]


def commands(cmd, path: str = "r1") -> list[tuple[str, object]]:
    """(path, command) of the app and every sub-command, read from the typer app (not from the generator)."""
    out = [(path, cmd)]
    if hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd, info_name=path.split()[-1])
        for name in cmd.list_commands(ctx):
            out += commands(cmd.get_command(ctx, name), f"{path} {name}")
    return out


def section(page: str, path: str) -> str | None:
    """The text under the heading ``path`` (any level) up to the next heading of that level or above."""
    match = re.search(rf"^(#+) {re.escape(path)}\n", page, re.M)
    if match is None:
        return None
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", page[match.end():], re.M)
    return page[match.end():match.end() + end.start()] if end else page[match.end():]


def missing_from_page(root, page: str) -> list[str]:
    """Each command of ``root`` without its section, and each of its arguments and options (every flag spelling,
    hidden ones too) not named in that section."""
    missing = []
    for path, cmd in commands(root):
        text = section(page, path)
        if text is None:
            missing.append(f"command {path!r}: no section")
            continue
        for param in cmd.params:
            if getattr(param, "param_type_name", "") == "argument":
                names = [getattr(param, "metavar", None) or param.name.upper()]
            else:
                names = [*param.opts, *param.secondary_opts]
            missing += [f"{path} {n}" for n in names if f"`{n}`" not in text]
    return missing


def r1():
    from flows.cli import app

    return typer.main.get_command(app)


def test_the_page_is_what_the_generator_renders(rendered):
    assert PAGE.read_text() == rendered, f"docs/reference/cli.md is out of date: {REGENERATE}"


def test_every_command_argument_and_option_is_on_the_page():
    missing = missing_from_page(r1(), PAGE.read_text())
    assert not missing, f"not on docs/reference/cli.md: {missing}; {REGENERATE}"


def test_the_coverage_check_notices_a_new_option():
    from flows.cli import build_app

    app = build_app()

    def brand_new(flag: bool = typer.Option(False, "--brand-new-flag", help="new")) -> None:
        """A command the page does not have."""

    def run_with_new_option(new: int = typer.Option(1, "--brand-new-option", help="new")) -> None:
        """Run, with an option the page does not have."""

    app.command("brand-new")(brand_new)
    first = app.registered_commands[0]  # `r1 run`, with one option more
    first.name, first.callback = first.name or first.callback.__name__, run_with_new_option
    missing = missing_from_page(typer.main.get_command(app), PAGE.read_text())
    assert "command 'r1 brand-new': no section" in missing and "r1 run --brand-new-option" in missing, missing


def test_every_option_and_argument_of_r1_has_help():
    bare = [f"{path} {p.name}" for path, cmd in commands(r1()) for p in cmd.params if not getattr(p, "help", None)]
    assert not bare, f"give these a help= in flows/cli*.py: {bare}"


def test_the_page_is_deterministic(cli_ref, rendered, monkeypatch):
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("R1_STORE", "/somewhere/else")
    assert cli_ref.render()["reference/cli.md"] == rendered
    assert str(ROOT) not in rendered and str(Path.home()) not in rendered
    assert "python docs/gen/regenerate.py" in rendered.split("\n## ")[0], "the page says how it is generated"


def test_every_entry_point_users_run_is_on_the_page():
    from tests.test_entry_points import command, entry_points

    page = PAGE.read_text()
    for path in entry_points():
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "tests" or rel.as_posix() == "flows/cli.py":  # benchmarks: their own page; cli.py: r1
            continue
        shown = " ".join(command(path)[1:-1])  # `-m pkg.module` or the script's path
        assert re.search(rf"^### python {re.escape(shown)}$", page, re.M), f"{rel}: no section; {REGENERATE}"


def test_an_argparse_entry_point_lists_every_option_without_importing_its_module(cli_ref):
    import ast
    import sys

    rel = Path("grpo_core/generation/serve.py")
    already = "grpo_core.generation.serve" in sys.modules
    parser = cli_ref.argparse_parser(rel, ast.parse((ROOT / rel).read_text()))
    assert parser is not None and ("grpo_core.generation.serve" in sys.modules) == already
    text = section(PAGE.read_text(), "python -m grpo_core.generation.serve")
    flags = [o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]
    assert flags and all(f"`{f}`" in text for f in flags), flags
