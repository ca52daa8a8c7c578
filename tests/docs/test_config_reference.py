"""The configuration reference (``docs/reference/configuration.md``, ``docs/reference/configs.md``) is generated from
the pydantic models by ``docs/gen/config_ref.py``: the pages on disk are what it renders now (a field added, renamed
or redescribed without regenerating fails here), every field of every model a pipeline config can hold has a
description and a row with its type and default, and every shipped config has its entry."""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path

import pytest
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FIX = "run `python docs/gen/regenerate.py` and commit the pages"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("docs_config_ref", DOCS / "gen" / "config_ref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stale_pages(pages: dict[str, str]) -> list[str]:
    """A unified diff's head for each page whose file is not ``pages``' text."""
    out = []
    for rel, text in pages.items():
        path = DOCS / rel
        on_disk = path.read_text() if path.is_file() else ""
        if on_disk != text:
            diff = difflib.unified_diff(on_disk.splitlines(), text.splitlines(), f"docs/{rel} (on disk)",
                                        f"docs/{rel} (from the models)", lineterm="", n=1)
            out.append("\n".join(list(diff)[:30]))
    return out


def missing_descriptions(gen) -> list[str]:
    return [f"{model.__name__}.{name}" for model in gen.reachable_models()
            for name, info in model.model_fields.items() if not (info.description or "").strip()]


def test_pages_are_what_the_models_give(gen):
    stale = stale_pages(gen.render())
    assert not stale, f"the generated configuration pages are stale: {FIX}.\n\n" + "\n\n".join(stale)


def test_a_field_added_without_regenerating_fails(gen, monkeypatch):
    """The two checks above and below see a new field: the page no longer matches, and it has no description."""
    from tasks.config.pipeline import RunSettings

    # a field in the class's fields, its default a class attribute (what the instances built before it read)
    monkeypatch.setitem(RunSettings.model_fields, "dummy_option", FieldInfo(annotation=int, default=3))
    monkeypatch.setattr(RunSettings, "dummy_option", 3, raising=False)
    assert stale_pages(gen.render()), "a field added to RunSettings left the pages as they were"
    assert missing_descriptions(gen) == ["RunSettings.dummy_option"]


def test_every_field_has_a_description(gen):
    missing = missing_descriptions(gen)
    assert not missing, ("fields without a description: " + ", ".join(missing) + "; give each "
                         "Field(..., description=\"...\"): what the code does with it, in a line or two")


def _cells(row: str) -> list[str]:
    """A markdown table row's cells: split on the pipes outside code spans that are not escaped."""
    cells, cell, fence, i = [], "", "", 0
    body = row.strip()[1:-1]
    while i < len(body):
        char = body[i]
        if char == "\\" and not fence:
            cell += body[i:i + 2]
            i += 2
            continue
        if char == "`":
            run = re.match(r"`+", body[i:]).group(0)
            fence = "" if fence == run else (fence or run)
            cell += run
            i += len(run)
            continue
        if char == "|" and not fence:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
        i += 1
    return cells + [cell.strip()]


def _plain(cell: str) -> str:
    """A cell's text as read: links as their text, no code fences, escapes undone."""
    cell = re.sub(r"(?<!\\)\[([^\[\]]*)\]\([^)]*\)", r"\1", cell)
    cell = re.sub(r"(`+) ?(.*?) ?\1", r"\2", cell)
    return re.sub(r"\\(.)", r"\1", cell)


def test_every_field_has_a_row_with_its_type_and_default(gen):
    text = (DOCS / gen.CONFIGURATION).read_text()
    rows = {m.group(1): _cells(line) for line in text.splitlines() if (m := re.match(r'\| <a id="([^"]+)"></a>', line))}
    problems = []
    for model in gen.reachable_models():
        if model.__name__ != "PipelineConfig" and not re.search(rf"^##+ {model.__name__}$", text, re.M):
            problems.append(f"{model.__name__}: no heading")
        for name, info in model.model_fields.items():
            cells = rows.get(gen.field_anchor(model, name))
            if cells is None:
                problems.append(f"{model.__name__}.{name}: no row")
                continue
            type_cell, default_cell = cells[1], cells[3 if model.__name__ == "PipelineConfig" else 2]
            if _plain(type_cell) != gen.type_text(info.annotation):
                problems.append(f"{model.__name__}.{name}: type {_plain(type_cell)!r}, expected "
                                f"{gen.type_text(info.annotation)!r}")
            expected = "required" if info.is_required() else gen.yaml_flow(gen.field_default(info))
            shown = _plain(default_cell)
            if not (shown == expected or (shown.endswith(" items)") and expected.startswith(shown.split(" ...")[0]))):
                problems.append(f"{model.__name__}.{name}: default {shown!r}, expected {expected!r}")
            if (info.description or "").split()[:1] and not cells[-1]:
                problems.append(f"{model.__name__}.{name}: empty description cell")
    assert not problems, f"configuration.md does not show every field ({FIX}):\n" + "\n".join(problems)


def test_every_section_names_its_readers(gen):
    """The stage table names each stage's section; the others are in READERS_OUTSIDE_TABLE, and no entry there
    shadows a section the table names."""
    from tasks.config.pipeline import PipelineConfig

    for section in PipelineConfig.model_fields:
        assert gen.readers_markdown(section)
        assert not (gen.section_readers(section) and section in gen.READERS_OUTSIDE_TABLE), section


def test_every_shipped_config_is_on_the_configs_page(gen):
    text = (DOCS / gen.CONFIGS).read_text()
    configs = sorted((ROOT / "configs").glob("*.yaml"))
    assert configs, "no configs/*.yaml found"
    for path in configs:
        assert f"\n## {path.name}\n" in text, f"{path.name} has no section in configs.md ({FIX})"
        assert path.read_text().rstrip("\n") in text, f"configs.md does not hold {path.name} as it is ({FIX})"
        assert f"](/configs/{path.name})" in text
