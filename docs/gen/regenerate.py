"""Rewrite the generated reference pages: ``python docs/gen/regenerate.py`` from the repository root.

The configuration reference and shipped configs (``config_ref.py``, from the pydantic models and ``configs/``) and
the CLI reference (``cli_ref.py``, from the typer app). tests/docs checks that the pages on disk equal what these
render, so a field, command or option added without regenerating fails a test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent
GENERATORS = ("config_ref", "cli_ref")


def load(name: str):
    """One generator module of this folder (the folder is not a package: MkDocs excludes it from the site)."""
    spec = importlib.util.spec_from_file_location(f"docs_gen_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> dict[str, str]:
    """Every generated page: its path under docs/ -> its text."""
    out: dict[str, str] = {}
    for name in GENERATORS:
        out.update(load(name).render())
    return out


def main() -> None:
    for rel, text in pages().items():
        path = DOCS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote docs/{rel}")


if __name__ == "__main__":
    main()
