"""MkDocs hooks: links from the pages to the code.

A page links to a file of the repository with a root-relative link, ``[loss.py](/grpo_core/trainer/loss.py)``: on a
Git host's file view that link opens the file itself; in the built site the file is copied under ``src/`` and the
link points there, so the site stands alone. A link to a file that does not exist is a warning, which
``mkdocs build --strict`` turns into a failed build: a renamed module breaks the docs' build, not a reader's click.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.code_links")
ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("grpo_core", "tasks", "flows", "tests", "configs", "infra", ".ci")
CODE_FILES = ("pyproject.toml", "mkdocs.yml", "README.md")
LINK = re.compile(r"\]\(/((?:%s)/[^)#\s]*|%s)(#[^)\s]*)?\)" % (
    "|".join(re.escape(d) for d in CODE_DIRS), "|".join(re.escape(f) for f in CODE_FILES)))


def code_links(markdown: str) -> list[str]:
    """The repository paths ``markdown`` links to (root-relative links into the code)."""
    return [m.group(1).rstrip("/") for m in LINK.finditer(markdown)]


def on_files(files: Files, config) -> Files:
    """Copy every linked file of the repository into the site under ``src/``."""
    wanted: set[str] = set()
    for page in Path(config["docs_dir"]).rglob("*.md"):
        wanted.update(code_links(page.read_text()))
    for rel in sorted(wanted):
        path = ROOT / rel
        if path.is_file():
            files.append(File.generated(config, f"src/{rel}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Point each root-relative code link at its copy under ``src/``; warn (a failed strict build) when it is not a
    file of the repository."""
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        rel = match.group(1).rstrip("/")
        path = ROOT / rel
        if not path.exists():
            log.warning("%s links to %s, which is not in the repository", page.file.src_uri, rel)
            return match.group(0)
        if path.is_dir():
            log.warning("%s links to the folder %s: link a file in it (its __init__.py, a README)",
                        page.file.src_uri, rel)
            return match.group(0)
        return f"]({posixpath.relpath(f'src/{rel}', here or '.')})"

    return LINK.sub(rewrite, markdown)
